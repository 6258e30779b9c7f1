package redislock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// levels runs Diagnose on a driver of addr and returns each check's level
// (the worst, where a check reports per server).
func levels(t *testing.T, addr string, opts ...Option) map[string]backend.Level {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	d, err := New(rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fs, err := d.Diagnose(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]backend.Level{}
	for _, f := range fs {
		if !strings.Contains(f.What, addr) {
			t.Errorf("%s: %q does not name the server", f.Check, f.What)
		}
		got[f.Check] = max(got[f.Check], f.Level)
	}
	return got
}

// The shared server, as scripts/services.sh configures it, is sound in
// what can lose a lock; a server that may evict keys, and a replica, are
// unsafe.
func TestDiagnose(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	got := levels(t, testenv.RedisAddr())
	for _, c := range []string{"redis.maxmemory-policy", "redis.persistence", "redis.replication"} {
		if l, ok := got[c]; !ok || l != backend.Sound {
			t.Errorf("default server: %s %v (reported %v), want ok", c, l, ok)
		}
	}

	evicting := testenv.StartRedisWith(t, "--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru")
	if l := levels(t, evicting.Addr)["redis.maxmemory-policy"]; l != backend.Unsafe {
		t.Errorf("volatile-lru with maxmemory: %v, want unsafe", l)
	}
	replica := testenv.StartRedisWith(t, "--replicaof", "127.0.0.1", strings.Split(evicting.Addr, ":")[1])
	if l := levels(t, replica.Addr)["redis.replication"]; l != backend.Unsafe {
		t.Errorf("a replica: %v, want unsafe", l)
	}
	// The master lists the replica once it has connected.
	admin := redis.NewClient(&redis.Options{Addr: evicting.Addr})
	defer admin.Close()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, _ := admin.Info(context.Background(), "replication").Result()
		if infoField(info, "connected_slaves") == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not connect: %s", info)
		}
	}
	if l := levels(t, evicting.Addr)["redis.replication"]; l != backend.Warning {
		t.Errorf("a master with a replica: %v, want warning", l)
	}
	durable := testenv.StartRedisWith(t, "--appendonly", "yes", "--appendfsync", "always")
	if l := levels(t, durable.Addr)["redis.persistence"]; l != backend.Sound {
		t.Errorf("appendfsync always: %v, want ok", l)
	}
}

// A quorum runs each member's checks: five members, each named.
func TestDiagnoseQuorum(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q, err := OpenQuorum(ctx, "redis+quorum://"+strings.Join(addrs, ",")+"/0")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	fs, err := q.Diagnose(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		n := 0
		for _, f := range fs {
			if f.Check == "redis.maxmemory-policy" && strings.Contains(f.What, a) && f.Level == backend.Sound {
				n++
			}
		}
		if n != 1 {
			t.Errorf("member %s: %d sound maxmemory-policy findings, want 1: %+v", a, n, fs)
		}
	}
}
