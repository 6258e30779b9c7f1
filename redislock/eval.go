package redislock

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// script is a Lua script of this package, its hash boxed once for run.
type script struct {
	*redis.Script
	src  string
	hash any
}

func newScript(src string) *script {
	s := redis.NewScript(src)
	return &script{Script: s, src: src, hash: s.Hash()}
}

// run is redis.Script.Run: EVALSHA, then EVAL when the server answers
// NOSCRIPT (a restart or failover emptied its script cache).
func (s *script) run(ctx context.Context, rdb redis.UniversalClient, keys []string, args ...any) *redis.Cmd {
	return evalsha(ctx, rdb, s.hash, s.src, keys, args...)
}

// evalsha sends EVALSHA of hash, and EVAL of src if src is not empty and
// the server answers NOSCRIPT, with the command's arguments in one slice
// that go-redis sends as it is: its Eval copies keys and args into one of
// its own, boxes the hash and each key, at every call. Here the keys go as
// pointers into keys (go-redis writes a *string as the string): one
// allocation, keys', where each key would cost one.
func evalsha(ctx context.Context, rdb redis.UniversalClient, hash any, src string, keys []string, args ...any) *redis.Cmd {
	a := make([]any, 3, 3+len(keys)+len(args))
	a[0], a[1], a[2] = "evalsha", hash, len(keys)
	for i := range keys {
		a = append(a, &keys[i])
	}
	a = append(a, args...)
	cmd := process(ctx, rdb, a)
	if src != "" && isNoScript(cmd.Err()) {
		a[0], a[1] = "eval", src
		cmd = process(ctx, rdb, a)
	}
	return cmd
}

func process(ctx context.Context, rdb redis.UniversalClient, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	if args[2] != 0 {
		cmd.SetFirstKeyPos(3) // a cluster's or a ring's routing
	}
	_ = rdb.Process(ctx, cmd)
	return cmd
}
