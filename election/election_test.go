package election_test

import (
	"context"
	"errors"
	"net/url"
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
	_ "github.com/lockerhq/locker/pglock"
	_ "github.com/lockerhq/locker/redislock"
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
	gran  time.Duration // the store's TTL granularity
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
		{name: "memcache", addrs: []string{testenv.MemcacheAddr()}, gran: time.Second, url: func(_ *testing.T, a []string) string {
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
			terms[k].end = end
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
