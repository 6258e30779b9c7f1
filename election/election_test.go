package election_test

import (
	"context"
	"errors"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/election"
	"github.com/lockerhq/locker/internal/faultproxy"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"

	_ "github.com/lockerhq/locker/etcdlock"
	_ "github.com/lockerhq/locker/filelock"
	_ "github.com/lockerhq/locker/memcachelock"
	_ "github.com/lockerhq/locker/memlock"
	_ "github.com/lockerhq/locker/redislock"
	_ "github.com/lockerhq/locker/sqllock"
	_ "github.com/lockerhq/locker/zklock"
)

// ttl is the election's TTL: etcd grants no shorter lease, and ZooKeeper's
// session (session_timeout=2s) is as long.
const ttl = 2 * time.Second

// target is a backend under test. url builds its URL for the servers at
// addrs (the real ones, or proxies in front of them); a target without
// addrs has no connection to cut.
type target struct {
	name  string
	addrs []string
	gran  time.Duration // how late past the TTL the store may free a lock
	url   func(t *testing.T, addrs []string) string
}

func targets() []target {
	pg := func(_ *testing.T, addrs []string) string {
		u, err := url.Parse(testenv.PostgresURL())
		if err != nil {
			panic(err)
		}
		u.Host = addrs[0]
		return u.String()
	}
	mem := "mem://election-" + testutil.RandHex(4)
	var fileDir string
	var fileOnce sync.Once
	return []target{
		{name: "mem", url: func(*testing.T, []string) string { return mem }},
		{name: "file", url: func(t *testing.T, _ []string) string {
			fileOnce.Do(func() { fileDir = t.TempDir() })
			return (&url.URL{Scheme: "file", Path: fileDir}).String()
		}},
		{name: "redis", addrs: []string{testenv.RedisAddr()}, url: func(_ *testing.T, a []string) string {
			return "redis://" + a[0] + "/0"
		}},
		{name: "etcd", addrs: testenv.EtcdEndpoints(), gran: time.Second, url: func(_ *testing.T, a []string) string {
			return "etcd://" + strings.Join(a, ",") + "/locker-election"
		}},
		{name: "zk", addrs: testenv.ZKAddrs(), gran: time.Second, url: func(_ *testing.T, a []string) string {
			return "zk://" + strings.Join(a, ",") + "/locker-election?session_timeout=2s"
		}},
		{name: "postgres", addrs: []string{testenv.PostgresAddr()}, url: pg},
		// memcached frees an abandoned lock 1 to 2 s after its TTL (see
		// memcachelock's TTLs).
		{name: "memcache", addrs: []string{testenv.MemcacheAddr()}, gran: 2 * time.Second, url: func(_ *testing.T, a []string) string {
			return "memcache://" + a[0]
		}},
	}
}

// withNamespace puts raw's locks in namespace ns.
func withNamespace(raw, ns string) string {
	u, err := url.Parse(raw)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set("namespace", ns)
	u.RawQuery = q.Encode()
	return u.String()
}

// open returns a Client of tg in namespace ns, through proxies of its own
// when proxied (nil for a target without servers), closed at the test's end.
func open(t *testing.T, tg target, ns string, proxied bool) (*locker.Client, []*faultproxy.Proxy) {
	t.Helper()
	addrs := tg.addrs
	var proxies []*faultproxy.Proxy
	if proxied && len(addrs) > 0 {
		addrs = nil
		for _, a := range tg.addrs {
			p, err := faultproxy.New(a)
			if err != nil {
				t.Fatal(err)
			}
			proxies = append(proxies, p)
			addrs = append(addrs, p.Addr())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := locker.Open(ctx, withNamespace(tg.url(t, addrs), ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Registered after the Client's: runs before it, so that a Close
	// does not wait on a blackholed connection.
	t.Cleanup(func() {
		for _, p := range proxies {
			p.Close()
		}
	})
	return c, proxies
}

// term is one candidate's leadership as it saw it.
type term struct {
	cand       int
	number     uint64
	tm         *election.Term
	cause      error // why its Context ended
	start, end time.Time
}

// TestFailover: three candidates on Clients of their own and an observer
// on a fourth. The leader's Client closes (no resign), then the next
// leader's connection is blackholed (a cut network: its lock must run out),
// then the last resigns. Each time a new leader comes within the bound,
// terms increase, no two candidates believe they lead at once beyond
// margin, and the observer sees every term in order.
func TestFailover(t *testing.T) {
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			testenv.Require(t, tg.addrs...)
			failover(t, tg)
		})
	}
}

// margin is how long two candidates may both believe they lead: the delay
// between the lock's loss (or the Client's Close) and the cancellation of
// the old term's Context, against the store's release and the new
// leader's grant, which take network round trips.
const margin = 100 * time.Millisecond

func failover(t *testing.T, tg target) {
	ns := "el-" + testutil.RandHex(4)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()

	const n = 3
	clients := make([]*locker.Client, n)
	proxies := make([][]*faultproxy.Proxy, n)
	elections := make([]*election.Election, n)
	for i := range n {
		clients[i], proxies[i] = open(t, tg, ns, true)
		e, err := election.New(clients[i], "leader", election.Value("cand-"+string(rune('a'+i))), election.TTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		elections[i] = e
	}

	// The observer, on a Client of its own.
	oc, _ := open(t, tg, ns, false)
	oe, err := election.New(oc, "leader", election.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	octx, ocancel := context.WithCancel(ctx)
	feed, err := oe.Observe(octx)
	if err != nil {
		t.Fatal(err)
	}
	var smu sync.Mutex
	var seen []election.Leader
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		for l := range feed {
			smu.Lock()
			seen = append(seen, l)
			smu.Unlock()
		}
	}()
	// observed waits, boundedly, until the observer's last state is l.
	observed := func(l election.Leader) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
			smu.Lock()
			ok := len(seen) > 0 && seen[len(seen)-1] == l
			smu.Unlock()
			if ok {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Errorf("the observer did not see %+v within 2 s", l)
	}

	var mu sync.Mutex
	var terms []term
	started := make(chan int, n) // a candidate's index, as it starts leading
	ended := make(chan int, n)
	var wg sync.WaitGroup
	for i, e := range elections {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tm, err := e.Campaign(ctx)
			if err != nil {
				if !errors.Is(err, locker.ErrClosed) && ctx.Err() == nil {
					t.Errorf("candidate %d: %v", i, err)
				}
				return
			}
			start := time.Now()
			mu.Lock()
			k := len(terms)
			terms = append(terms, term{cand: i, number: tm.Number(), tm: tm, start: start})
			mu.Unlock()
			started <- i
			<-tm.Context().Done()
			end := time.Now()
			mu.Lock()
			terms[k].end, terms[k].cause = end, context.Cause(tm.Context())
			mu.Unlock()
			ended <- i
		}()
	}

	next := func(what string, since time.Time, bound time.Duration) int {
		t.Helper()
		select {
		case i := <-started:
			took := time.Since(since)
			t.Logf("%s: candidate %d leads after %v", what, i, took.Round(time.Millisecond))
			if took > bound {
				t.Errorf("%s: new leader after %v, want at most %v", what, took, bound)
			}
			return i
		case <-time.After(bound + 5*time.Second):
			t.Fatalf("%s: no new leader within %v", what, bound+5*time.Second)
		}
		return -1
	}
	// Wakes are a notification, a native queue or polling at 250 ms.
	const wake = 500 * time.Millisecond
	first := next("start", time.Now(), 5*time.Second)
	// Leader agrees with the Term.
	mu.Lock()
	want := terms[0]
	mu.Unlock()
	if l, err := oe.Leader(ctx); err != nil || !l.Held || l.Value != elections[first].Value() || l.Term != want.number {
		t.Errorf("Leader = %+v, %v; want held by %q in term %d", l, err, elections[first].Value(), want.number)
	}

	// Each term lasts until the observer has seen it: a term shorter than
	// the poll interval may be missed, as Observe's documentation says.
	seenTerm := func(k int) {
		t.Helper()
		mu.Lock()
		tm := terms[k]
		mu.Unlock()
		observed(election.Leader{Held: true, Value: elections[tm.cand].Value(), Term: tm.number})
	}
	seenTerm(0)

	// 1. The leader's Client closes without resigning.
	closed := time.Now()
	clients[first].Close()
	second := next("close", closed, wake+tg.gran)

	// 2. The second leader is cut off: its lock runs out.
	seenTerm(1)
	var third int
	if len(proxies[second]) > 0 {
		cut := time.Now()
		for _, p := range proxies[second] {
			p.Blackhole()
		}
		third = next("cut", cut, ttl+tg.gran+wake+time.Second)
	} else {
		// No connection to cut (mem, file): close it as well.
		closed := time.Now()
		clients[second].Close()
		third = next("close 2", closed, wake+tg.gran)
	}

	// 3. The last resigns, once the observer has seen its term.
	mu.Lock()
	last := terms[2]
	mu.Unlock()
	if last.cand != third {
		t.Fatalf("third term is candidate %d's, want %d's", last.cand, third)
	}
	seenTerm(2)
	if err := last.tm.Resign(ctx); err != nil {
		t.Errorf("Resign: %v", err)
	}
	if cause := context.Cause(last.tm.Context()); !errors.Is(cause, election.ErrResigned) {
		t.Errorf("resigned term's cause %v, want ErrResigned", cause)
	}
	observed(election.Leader{})
	for range n {
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatal("a term's Context is not done")
		}
	}
	wg.Wait()
	ocancel()
	select {
	case <-fed:
	case <-time.After(5 * time.Second):
		t.Fatal("Observe's channel not closed after its context ended")
	}

	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(terms); i++ {
		a, b := terms[i-1], terms[i]
		if b.number <= a.number {
			t.Errorf("term %d after term %d", b.number, a.number)
		}
		if over := a.end.Sub(b.start); over > margin {
			t.Errorf("candidates %d and %d both led for %v (terms %d, %d)", a.cand, b.cand, over, a.number, b.number)
		} else {
			t.Logf("terms %d→%d: overlap %v", a.number, b.number, over.Round(time.Microsecond))
		}
	}
	// Why each term ended: Close, the lost lock (or, without a connection
	// to cut, Close again), Resign.
	wantCause := []error{locker.ErrClosed, locker.ErrLost, election.ErrResigned}
	if len(proxies[0]) == 0 {
		wantCause[1] = locker.ErrClosed
	}
	for i, tm := range terms {
		if !errors.Is(tm.cause, wantCause[i]) {
			t.Errorf("term %d ended with %v, want %v", tm.number, tm.cause, wantCause[i])
		}
	}
	// The observer saw every term, in increasing order.
	var got []uint64
	for _, l := range seen {
		if l.Held {
			got = append(got, l.Term)
		}
	}
	var wantTerms []uint64
	for _, tm := range terms {
		wantTerms = append(wantTerms, tm.number)
	}
	if !equal(got, wantTerms) {
		t.Errorf("observer saw terms %v, want %v (feed %+v)", got, wantTerms, seen)
	}
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestResign: a resignation hands over at once; the longest value every
// backend keeps whole reads back whole; a candidate that resigned can
// campaign again.
func TestResign(t *testing.T) {
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			testenv.Require(t, tg.addrs...)
			ns := "el-" + testutil.RandHex(4)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ca, _ := open(t, tg, ns, false)
			cb, _ := open(t, tg, ns, false)
			long := strings.Repeat("é", election.MaxValueLen/2) // 64 bytes
			a, err := election.New(ca, "leader", election.Value(long), election.TTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			b, err := election.New(cb, "leader", election.Value("b"), election.TTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			ta, err := a.Campaign(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if l, err := b.Leader(ctx); err != nil || l != (election.Leader{Held: true, Value: long, Term: ta.Number()}) {
				t.Errorf("Leader = %+v, %v; want %q in term %d", l, err, long, ta.Number())
			}

			got := make(chan *election.Term, 1)
			go func() {
				tb, err := b.Campaign(ctx)
				if err != nil {
					t.Error(err)
				}
				got <- tb
			}()
			// b waits in the store (or polls) before a resigns.
			time.Sleep(100 * time.Millisecond)
			resigned := time.Now()
			if err := ta.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			if ta.Context().Err() == nil {
				t.Error("a resigned term's Context is not done")
			}
			var tb *election.Term
			select {
			case tb = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("no new leader 10 s after a resignation")
			}
			if tb == nil {
				return
			}
			took := time.Since(resigned)
			t.Logf("handover after %v", took.Round(time.Millisecond))
			// A release wakes the next one: a notification, a native queue
			// or polling at 250 ms; memcached's and etcd's granularity does
			// not come into it.
			if bound := 500 * time.Millisecond; took > bound {
				t.Errorf("handover after %v, want at most %v", took, bound)
			}
			if tb.Number() <= ta.Number() {
				t.Errorf("term %d after term %d", tb.Number(), ta.Number())
			}
			// a campaigns again: it waits for b.
			wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer wcancel()
			if _, err := a.Campaign(wctx); !errors.Is(err, locker.ErrNotAcquired) {
				t.Errorf("Campaign while b leads = %v, want ErrNotAcquired", err)
			}
			if err := tb.Resign(ctx); err != nil {
				t.Error(err)
			}
			if err := tb.Resign(ctx); err != nil {
				t.Errorf("second Resign = %v, want nil", err)
			}
		})
	}
}

// TestInput: bad input is a typed error from New, before any call.
func TestInput(t *testing.T) {
	c, err := locker.Open(context.Background(), "mem://election-input-"+testutil.RandHex(4))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		name string
		opts []election.Option
		want error
	}{
		{"too long", []election.Option{election.Value(strings.Repeat("x", election.MaxValueLen+1))}, election.ErrInvalidValue},
		{"empty", []election.Option{election.Value("")}, election.ErrInvalidValue},
		{"not UTF-8", []election.Option{election.Value("a\xffb")}, election.ErrInvalidValue},
		{"NUL", []election.Option{election.Value("a\x00b")}, election.ErrInvalidValue},
		{"TTL", []election.Option{election.TTL(-time.Second)}, locker.ErrInvalidTTL},
		{"poll", []election.Option{election.PollEvery(-time.Second)}, locker.ErrUnsupported},
	} {
		if _, err := election.New(c, "leader", tc.opts...); !errors.Is(err, tc.want) {
			t.Errorf("%s: New = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := election.New(c, "", election.Value("v")); !errors.Is(err, locker.ErrInvalidName) {
		t.Errorf("empty name: New = %v, want ErrInvalidName", err)
	}
	if _, err := election.New(nil, "leader"); err == nil {
		t.Error("nil Client: New = nil error")
	}
	e, err := election.New(c, "leader", election.Value(strings.Repeat("x", election.MaxValueLen)))
	if err != nil || e.Value() != strings.Repeat("x", election.MaxValueLen) {
		t.Errorf("New with a %d-byte value = %v", election.MaxValueLen, err)
	}
	if d, err := election.New(c, "leader"); err != nil || len(d.Value()) != 16 {
		t.Errorf("default value %q, %v; want 16 hex digits", d.Value(), err)
	}
}

// TestCampaigning: two candidates with one value on one Client would both
// lead through the Client's reentrancy: the second is refused while the
// first campaigns or leads, and welcome after.
func TestCampaigning(t *testing.T) {
	c, err := locker.Open(context.Background(), "mem://election-dup-"+testutil.RandHex(4))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	a, _ := election.New(c, "leader", election.Value("v"))
	b, _ := election.New(c, "leader", election.Value("v"))
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Campaign(ctx); !errors.Is(err, election.ErrCampaigning) {
		t.Fatalf("second Campaign = %v, want ErrCampaigning", err)
	}
	if _, err := a.Campaign(ctx); !errors.Is(err, election.ErrCampaigning) {
		t.Fatalf("Campaign while leading = %v, want ErrCampaigning", err)
	}
	if err := ta.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	tb, err := b.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tb.Number() <= ta.Number() {
		t.Errorf("term %d after %d", tb.Number(), ta.Number())
	}
	// A campaign that gives up is forgotten too.
	other, _ := election.New(c, "leader", election.Value("w"))
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := other.Campaign(wctx); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("Campaign while held = %v, want ErrNotAcquired", err)
	}
	// Close ends the term: its Context is done, with ErrClosed as cause.
	c.Close()
	select {
	case <-tb.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the term's Context outlived Close by 5 s")
	}
	if cause := context.Cause(tb.Context()); !errors.Is(cause, locker.ErrClosed) {
		t.Errorf("cause %v, want ErrClosed", cause)
	}
	if _, err := other.Campaign(ctx); !errors.Is(err, locker.ErrClosed) {
		t.Errorf("Campaign after Close = %v, want ErrClosed", err)
	}
}

// TestNoGoroutineLeft: Observe's goroutine ends with its context, and a
// term's with its resignation.
func TestNoGoroutineLeft(t *testing.T) {
	c, err := locker.Open(context.Background(), "mem://election-leak-"+testutil.RandHex(4))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e, err := election.New(c, "leader", election.PollEvery(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	feed, err := e.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l := <-feed; l.Held {
		t.Errorf("first state %+v, want free", l)
	}
	tm, err := e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l := <-feed; !l.Held || l.Term != tm.Number() {
		t.Errorf("state %+v, want term %d", l, tm.Number())
	}
	if err := tm.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	for open := true; open; {
		select {
		case _, open = <-feed:
		case <-time.After(2 * time.Second):
			t.Fatal("Observe's channel open 2 s after its context ended")
		}
	}
	for deadline := time.Now().Add(2 * time.Second); runtime.NumGoroutine() > base; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before Observe and Campaign", runtime.NumGoroutine(), base)
		}
	}
}
