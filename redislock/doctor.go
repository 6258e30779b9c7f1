package redislock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// Diagnose implements backend.Diagnoser: on each server that holds keys,
// eviction, persistence (and the delayed restart's cost with ttl),
// replication, the cluster's state and the credential's rights.
func (d *Driver) Diagnose(ctx context.Context, ttl time.Duration) ([]backend.Finding, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("redislock: diagnose: %w", err)
	}
	defer done()
	fs := backend.Findings{Check: "redis."}
	if c, ok := d.dep.rdb.(*redis.ClusterClient); ok {
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil {
			return nil, fmt.Errorf("redislock: diagnose: %w", err)
		}
		if state := infoField(info, "cluster_state"); state != "ok" {
			fs.Add("cluster-state", backend.Unsafe, "cluster_state is "+state, "slots without a master refuse every lock on them",
				"bring the cluster back to cluster_state:ok (redis-cli --cluster check)")
		} else {
			fs.Add("cluster-state", backend.Sound, "cluster_state ok", "", "")
		}
	}
	f, err := d.dep.diagnose(ctx, ttl)
	if err != nil {
		return nil, fmt.Errorf("redislock: diagnose: %w", err)
	}
	return append(fs.List, f...), nil
}

// Diagnose implements backend.Diagnoser for a quorum: each member's
// checks; a silent member is a warning, as the quorum stands without it.
func (q *Quorum) Diagnose(ctx context.Context, ttl time.Duration) ([]backend.Finding, error) {
	ctx, done, err := q.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("redislock: diagnose: %w", err)
	}
	defer done()
	var fs []backend.Finding
	for i, dep := range q.deps {
		f, err := dep.diagnose(ctx, ttl)
		if err != nil {
			fs = append(fs, backend.Finding{Check: "redis.member", Level: backend.Warning, What: q.addrs[i] + ": no answer: " + err.Error(),
				Why: fmt.Sprintf("the quorum needs %d of %d members; each one down brings it closer to refusing every lock", q.quorum, len(q.deps)),
				Fix: "bring the member back"})
			continue
		}
		fs = append(fs, f...)
	}
	return fs, nil
}

// diagnose runs the checks of each server of dep.
func (dep *deployment) diagnose(ctx context.Context, ttl time.Duration) ([]backend.Finding, error) {
	var fs []backend.Finding
	var mu sync.Mutex
	err := dep.eachServer(ctx, func(ctx context.Context, c *redis.Client) error {
		f, err := diagnose(ctx, c, c.Options().Addr, ttl, dep.restartMax)
		mu.Lock()
		fs = append(fs, f...)
		mu.Unlock()
		return err
	})
	return fs, err
}

// StoreTime implements backend.StoreClock: the server's TIME.
func (d *Driver) StoreTime(ctx context.Context) (time.Time, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("redislock: %w", err)
	}
	defer done()
	t, err := d.dep.rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("redislock: %w", err)
	}
	return t, nil
}

// diagnose checks one server.
func diagnose(ctx context.Context, c *redis.Client, addr string, ttl, restartMax time.Duration) ([]backend.Finding, error) {
	fs := backend.Findings{Check: "redis.", What: addr + ": "}
	cfg, err := c.ConfigGet(ctx, "*").Result()
	if err != nil {
		fs.Add("config", backend.Warning, "cannot read the configuration: "+err.Error(),
			"eviction and persistence cannot be checked", "allow CONFIG GET to the doctor's user, or check maxmemory-policy and appendfsync by hand")
	} else {
		policy, maxmem := cfg["maxmemory-policy"], cfg["maxmemory"]
		switch {
		case policy == "noeviction":
			fs.Add("maxmemory-policy", backend.Sound, "maxmemory-policy noeviction", "", "")
		case maxmem == "0":
			fs.Add("maxmemory-policy", backend.Warning, "maxmemory-policy "+policy+" with no maxmemory: nothing is evicted today",
				"once a maxmemory is set, an evicted lock key is a lock lost without its holder knowing, and a second holder let in",
				"CONFIG SET maxmemory-policy noeviction (and in redis.conf)")
		default:
			fs.Add("maxmemory-policy", backend.Unsafe, "maxmemory-policy "+policy+" with maxmemory "+maxmem,
				"an evicted lock key is a lock lost without its holder knowing, and a second holder let in",
				"CONFIG SET maxmemory-policy noeviction (and in redis.conf), or a server of its own for locks")
		}
		delay := "one TTL"
		if ttl > 0 {
			delay = ttl.String()
			if restartMax >= 0 && restartMax < ttl {
				delay = restartMax.String()
			}
		}
		aof := "no append-only file"
		if cfg["appendonly"] == "yes" {
			aof = "appendfsync " + cfg["appendfsync"]
		}
		what := aof + ": a restart may forget locks, so a restarted server refuses the names it has no fence for, for " + delay + " (the delayed restart)"
		if cfg["appendonly"] == "yes" && cfg["appendfsync"] == "always" {
			what = aof + ": a restart forgets no lock"
			if restartMax != 0 {
				what += ", so the delayed restart (" + delay + " refusing names after each restart) buys nothing here: restart_delay=0 turns it off"
			}
		}
		fs.Add("persistence", backend.Sound, what, "", "")
	}
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return fs.List, err
	}
	switch role, n := infoField(info, "role"), infoField(info, "connected_slaves"); {
	case role != "master":
		fs.Add("replication", backend.Unsafe, "a replica (role "+role+")", "a replica refuses writes, and a lock taken on it would not be seen by its master",
			"point the URL at the master")
	case n != "" && n != "0":
		fs.Add("replication", backend.Warning, n+" replicas, replicated asynchronously",
			"a failover to a replica that missed the last grants hands those locks out again while their holders run (fences stay ordered by the clock floor)",
			"use a Quorum over independent servers (redis+quorum://) for locks that must survive a failover, or no replicas")
	default:
		fs.Add("replication", backend.Sound, "no replicas", "", "")
	}
	user, err := c.Do(ctx, "ACL", "WHOAMI").Text()
	if err != nil {
		user = "default"
	}
	// ACL GETUSER's reply is a map under RESP3, a flat list under RESP2.
	if v, err := c.Do(ctx, "ACL", "GETUSER", user).Result(); err == nil {
		var commands string
		switch r := v.(type) {
		case map[any]any:
			commands, _ = r["commands"].(string)
		case []any:
			for i := 0; i+1 < len(r); i += 2 {
				if k, _ := r[i].(string); k == "commands" {
					commands, _ = r[i+1].(string)
				}
			}
		}
		switch {
		case strings.Contains(commands, "+@all"):
			fs.Add("acl", backend.Warning, "the credential may run every command",
				"a leaked lock credential can then read or wipe everything on the server",
				"a user with the least rules: see redislock.ACL and docs/backends/redislock.md, Least privilege")
		case commands != "":
			fs.Add("acl", backend.Sound, "the credential's commands are limited", "", "")
		}
	}
	return fs.List, nil
}

// infoField returns a field of an INFO or CLUSTER INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
