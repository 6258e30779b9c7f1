package redislock

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

func TestSchemesRegistered(t *testing.T) {
	var names []string
	for _, s := range backend.Schemes() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"redis", "rediss", "redis+cluster", "rediss+cluster", "redis+quorum", "rediss+quorum"} {
		if !slices.Contains(names, want) {
			t.Errorf("scheme %q is not registered (have %v)", want, names)
		}
	}
}

func TestOpenURL(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	addr := testenv.RedisAddr()
	c, err := locker.Open(ctx, "redis://"+addr+"/3?namespace=redislock-url&ttl=2s&dial_timeout=1s&client_name=locker")
	if err != nil {
		t.Fatalf("locker.Open: %v", err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if l.TTL() != 2*time.Second || l.Fence() == 0 {
		t.Fatalf("TTL %v fence %d", l.TTL(), l.Fence())
	}
	// It went to database 3.
	d, err := Open(ctx, "redis://"+addr+"/3")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if n, err := d.Client().Exists(ctx, keysFor(backend.Key("redislock-url", t.Name())).lock).Result(); err != nil || n != 1 {
		t.Fatalf("lock key in db 3: %d, %v", n, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestOpenBadURLs(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	addr := testenv.RedisAddr()
	for _, u := range []string{
		"redis://" + addr + "/0?bogus=1",
		"redis://user:s3cret@" + addr + "/0?wrte_timeout=1s",
		"redis://" + addr + "/notanumber",
		"redis://" + addr + "/0?dial_timeout=soon",
		"redis+cluster://user:s3cret@" + addr + "?bogus=1",
		"redis+cluster://" + addr + "/2",
		"redis+quorum://user:s3cret@" + addr + "," + addr + "/0?bogus=1",
		"redis+quorum:///0",
		"redis+cluster://" + addr + ",,",
		"redis+quorum://" + addr + ",," + addr + "/0",
		"redis://" + addr + "/0?retention=0s",
		"redis://" + addr + "/0?retention=-1h",
		"redis://" + addr + "/0?retention=soon",
		"redis+quorum://" + addr + "," + addr + "/0?retention=0",
		"redis:s3cret@" + addr + "/0", // no "//": never the default server
		"redis+quorum:s3cret@" + addr + "," + addr + "/0",
		"redis://" + addr + "/0?fair=maybe",
		"redis+quorum://" + addr + "," + addr + "/0?fair=false",
	} {
		_, err := locker.Open(ctx, u)
		if !errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", u, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%q): the error shows the password: %v", u, err)
		}
	}
	// A scheme that is not ours, given to our functions.
	if _, err := Open(ctx, "memcache://x"); !errors.Is(err, backend.ErrInvalidURL) {
		t.Errorf("Open(memcache://) = %v", err)
	}
	if _, err := OpenQuorum(ctx, "redis://x"); !errors.Is(err, backend.ErrInvalidURL) {
		t.Errorf("OpenQuorum(redis://) = %v", err)
	}
	// fair=true is OpenFair's; a bad value is refused by both.
	for _, u := range []string{"redis://" + addr + "/0?fair=true", "redis://" + addr + "/0?fair=maybe"} {
		if d, err := Open(ctx, u); !errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, %v, want ErrInvalidURL", u, d, err)
		}
	}
	if d, err := OpenFair(ctx, "redis://"+addr+"/0?fair=maybe"); !errors.Is(err, backend.ErrInvalidURL) {
		t.Errorf("OpenFair(fair=maybe) = %v, %v, want ErrInvalidURL", d, err)
	}
	for _, u := range []string{"redis://" + addr + "/0?fair=false", "redis://" + addr + "/0"} {
		d, err := OpenFair(ctx, u)
		if err != nil {
			t.Fatalf("OpenFair(%q): %v", u, err)
		}
		if !d.fair {
			t.Errorf("OpenFair(%q) is not fair", u)
		}
		d.Close()
	}
}

func TestOpenUnreachableFailsFast(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	for _, u := range []string{
		"redis://user:s3cret@127.0.0.1:1/0",
		"redis+quorum://user:s3cret@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/0",
	} {
		start := time.Now()
		_, err := locker.Open(ctx, u)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", u)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("Open(%q) took %v to fail", u, took)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%q): the error shows the password: %v", u, err)
		}
	}
	// A deadline bounds it as well.
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Open(dctx, "redis://10.255.255.1:6379/0?dial_timeout=10s"); err == nil {
		t.Fatal("Open of a black hole succeeded")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Open with a 300ms deadline took %v", took)
	}
}

func TestClusterURL(t *testing.T) {
	for _, c := range []struct {
		url   string
		addrs []string
		tls   bool
	}{
		{"redis+cluster://u:p@h1:7000,h2:7001,h3:7002?dial_timeout=2s", []string{"h1:7000", "h2:7001", "h3:7002"}, false},
		{"rediss+cluster://h1:7000?addr=h2:7001", []string{"h1:7000", "h2:7001"}, true},
		{"redis+cluster://h1", []string{"h1:6379"}, false},
	} {
		u, _ := url.Parse(c.url)
		o, err := clusterOptions(u)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if !slices.Equal(o.Addrs, c.addrs) || (o.TLSConfig != nil) != c.tls {
			t.Errorf("%s: addrs %v tls %v, want %v %v", c.url, o.Addrs, o.TLSConfig != nil, c.addrs, c.tls)
		}
		if strings.HasPrefix(c.url, "redis+cluster://u:p@") && (o.Username != "u" || o.Password != "p" || o.DialTimeout != 2*time.Second) {
			t.Errorf("%s: user %q password set %v dial timeout %v", c.url, o.Username, o.Password != "", o.DialTimeout)
		}
	}
}

func TestQuorumURL(t *testing.T) {
	addrs := testenv.RedisQuorumAddrs()
	testenv.Require(t, addrs...)
	t.Parallel()
	ctx := testCtx(t)
	q, err := OpenQuorum(ctx, "redis+quorum://"+strings.Join(addrs, ",")+"/0?dial_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if q.Quorum() != len(addrs)/2+1 || len(q.deps) != len(addrs) {
		t.Fatalf("quorum %d of %d", q.Quorum(), len(q.deps))
	}
	for _, n := range q.deps {
		if r := n.rdb.(*redis.Client).Options().MaxRetries; r > 0 {
			t.Fatalf("a quorum server retries (%d)", r)
		}
	}
}
