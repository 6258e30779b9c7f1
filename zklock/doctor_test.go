package zklock

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// diagnose runs d.Diagnose with ttl and returns its findings by check
// (the worst level, where a check reports per server).
func diagnose(t *testing.T, d *Driver, ttl time.Duration) (map[string]backend.Level, []backend.Finding) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fs, err := d.Diagnose(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]backend.Level{}
	for _, f := range fs {
		got[f.Check] = max(got[f.Check], f.Level)
		if f.Level != backend.Sound && (f.Why == "" || f.Fix == "") {
			t.Errorf("%s at %v without why or fix: %+v", f.Check, f.Level, f)
		}
	}
	return got, fs
}

func finding(fs []backend.Finding, check string) backend.Finding {
	for _, f := range fs {
		if f.Check == check {
			return f
		}
	}
	return backend.Finding{}
}

// doctorBase makes a world-writable node under which each driver of the
// test makes its root, and deletes the tree at the end.
func doctorBase(t *testing.T, servers []string, user, pw string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if err := waitSession(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if err := admin.AddAuth("digest", []byte(user+":"+pw)); err != nil {
		t.Fatal(err)
	}
	base := "/locker-doctor-" + newToken(t)[:8]
	if _, err := admin.Create(base, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteTree(admin, base) })
	return base
}

// On the shared standalone server: the session timeout against the TTL,
// clamped by the server's maximum; a standalone server; the root's ACL,
// sound with a credential, unsafe when anyone may delete; the store's
// clock. Diagnose changes nothing under the root.
func TestDiagnose(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	const user, pw = "locker", "doctor-pw"
	base := doctorBase(t, servers, user, pw)

	d := dial(t, servers, WithRoot(base+"/own"), WithDigestAuth(user, pw))
	_, before, err := d.conn.Get(d.root)
	if err != nil {
		t.Fatal(err)
	}
	got, fs := diagnose(t, d, d.SessionTTL())
	want := map[string]backend.Level{"zk.session-timeout": backend.Sound, "zk.mode": backend.Sound, "zk.ensemble": backend.Warning, "zk.acl": backend.Sound, "zk.auth": backend.Sound}
	for c, l := range want {
		if g, ok := got[c]; !ok || g != l {
			t.Errorf("%s: %v (reported %v), want %v", c, g, ok, l)
		}
	}
	if f := finding(fs, "zk.mode"); !strings.Contains(f.What, servers[0]) || !strings.Contains(f.What, "standalone") {
		t.Errorf("zk.mode: %q, want the server named, standalone", f.What)
	}
	if f := finding(fs, "zk.ensemble"); !strings.Contains(f.What, "standalone") {
		t.Errorf("zk.ensemble: %q, want standalone", f.What)
	}
	_, after, err := d.conn.Get(d.root)
	if err != nil {
		t.Fatal(err)
	}
	if *after != *before {
		t.Errorf("Diagnose changed the root: %+v, then %+v", before, after)
	}

	// A TTL longer than the session.
	got, fs = diagnose(t, d, 2*d.SessionTTL())
	if f := finding(fs, "zk.session-timeout"); got["zk.session-timeout"] != backend.Warning ||
		!strings.Contains(f.What, d.SessionTTL().String()) || !strings.Contains(f.What, (2*d.SessionTTL()).String()) {
		t.Errorf("TTL twice the session: %+v, want a warning with both", f)
	}

	// The server clamps 2m into its [1s, 60s]: the lock lives 60s.
	clamped := dial(t, servers, WithRoot(base+"/own"), WithDigestAuth(user, pw), WithSessionTimeout(2*time.Minute))
	if clamped.SessionTTL() != time.Minute {
		t.Fatalf("session timeout %v, want the server's maximum, 1m", clamped.SessionTTL())
	}
	got, fs = diagnose(t, clamped, 2*time.Minute)
	if f := finding(fs, "zk.session-timeout"); got["zk.session-timeout"] != backend.Warning ||
		!strings.Contains(f.What, "1m0s") || !strings.Contains(f.What, "2m0s") || !strings.Contains(f.Fix, "[1000ms, 60000ms]") {
		t.Errorf("a clamped session: %+v, want a warning with both values and the server's bounds", f)
	}

	// No credential: the driver's nodes are world-writable.
	open := dial(t, servers, WithRoot(base+"/open"))
	got, fs = diagnose(t, open, 0)
	if f := finding(fs, "zk.acl"); got["zk.acl"] != backend.Unsafe || !strings.Contains(f.What, "world:anyone:cdrwa") {
		t.Errorf("a world-writable root: %+v, want unsafe, naming the ACL", f)
	}
	if got["zk.auth"] != backend.Sound {
		t.Errorf("no credential on loopback: %+v, want ok", finding(fs, "zk.auth"))
	}
	// A credential, but anyone may create under the root.
	squattable := dial(t, servers, WithRoot(base+"/squat"), WithDigestAuth(user, pw),
		WithACL(append(zk.DigestACL(zk.PermAll, user, pw), zk.WorldACL(zk.PermCreate|zk.PermRead)...)))
	if got, fs := diagnose(t, squattable, 0); got["zk.acl"] != backend.Warning {
		t.Errorf("world:anyone:cr: %+v, want a warning", finding(fs, "zk.acl"))
	}

	// The store's clock: this host's, since the server runs here; nothing
	// is left under the root.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	st, err := d.StoreTime(ctx)
	t1 := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if st.Before(t0.Truncate(time.Millisecond)) || st.After(t1) {
		t.Errorf("StoreTime %v, outside [%v, %v]", st, t0, t1)
	}
	if kids, _, err := d.conn.Children(d.root); err != nil || len(kids) != 0 {
		t.Errorf("StoreTime left %v (%v) under the root", kids, err)
	}
}

// The shared ensemble: every server in a quorum, one leader, three voting
// members; a URL with one server of it is a warning.
func TestDiagnoseEnsemble(t *testing.T) {
	servers := testenv.ZKEnsemble()
	testenv.Require(t, servers...)
	const user, pw = "locker", "doctor-pw"
	base := doctorBase(t, servers, user, pw)

	d := dial(t, servers, WithRoot(base+"/all"), WithDigestAuth(user, pw))
	got, fs := diagnose(t, d, 0)
	if got["zk.mode"] != backend.Sound || got["zk.ensemble"] != backend.Sound || !strings.Contains(finding(fs, "zk.ensemble").What, "3 voting members") {
		t.Errorf("the ensemble: %+v, want ok, 3 voting members", fs)
	}
	leaders, modes := 0, 0
	for _, f := range fs {
		if f.Check == "zk.mode" {
			modes++
			if strings.HasSuffix(f.What, ": leader") {
				leaders++
			}
		}
	}
	if modes != len(servers) || leaders != 1 {
		t.Errorf("%d modes, %d leaders, want %d and 1: %+v", modes, leaders, len(servers), fs)
	}

	one := dial(t, servers[:1], WithRoot(base+"/one"), WithDigestAuth(user, pw))
	if got, fs := diagnose(t, one, 0); got["zk.ensemble"] != backend.Warning || !strings.Contains(finding(fs, "zk.ensemble").What, servers[0]) {
		t.Errorf("one server of the ensemble in the URL: %+v, want a warning naming it", finding(fs, "zk.ensemble"))
	}
}

// A server reached on an address of another host than loopback (here:
// this host's own non-loopback address, through a proxy) without a
// credential is a warning; an unreachable one is a warning naming it.
func TestDiagnoseRemote(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	var ip net.IP
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			ip = n.IP
			break
		}
	}
	if ip == nil {
		t.Skip("no non-loopback IPv4 address on this host")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Skipf("cannot listen on %v: %v", ip, err)
	}
	p := &proxy{ln: ln, target: servers[0], conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	base := doctorBase(t, servers, "locker", "doctor-pw")

	// A port nothing listens on: the URL's second server.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := gone.Addr().String()
	gone.Close()

	// dial would require every server to answer.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := dialDriver(ctx, []string{p.addr(), down}, WithRoot(base+"/remote"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, fs := diagnose(t, d, 0)
	if f := finding(fs, "zk.auth"); got["zk.auth"] != backend.Warning || !strings.Contains(f.What, p.addr()) {
		t.Errorf("no credential to %s: %+v, want a warning naming it", p.addr(), f)
	}
	unreachable := false
	for _, f := range fs {
		if f.Check == "zk.mode" && strings.HasPrefix(f.What, down+": unreachable") && f.Level == backend.Warning {
			unreachable = true
		}
	}
	if !unreachable {
		t.Errorf("no warning for the unreachable %s: %+v", down, fs)
	}
}

// A private ensemble of two: a warning, since a majority of 2 is 2. With
// one of them stopped, the other serves no requests: a warning naming it
// (the driver's session is on the shared server, also in its URL).
func TestDiagnoseTwoMembers(t *testing.T) {
	shared := testenv.ZKAddrs()
	testenv.Require(t, shared...)
	ms := testenv.StartZKEnsemble(t, 2)
	pair := []string{ms[0].Addr, ms[1].Addr}
	d := dial(t, pair, WithRoot("/locker-doctor"))
	if got, fs := diagnose(t, d, 0); got["zk.ensemble"] != backend.Warning || !strings.Contains(finding(fs, "zk.ensemble").What, "2 voting members") {
		t.Errorf("an ensemble of 2: %+v, want a warning", finding(fs, "zk.ensemble"))
	}
	d.Close()
	if err := ms[1].Stop(); err != nil {
		t.Fatal(err)
	}
	// The survivor leaves the quorum once it misses its peer (syncLimit).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		out, err := fourLetterWord(ctx, ms[0].Addr, "srvr")
		if err == nil && !strings.Contains(out, "Mode: ") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%s still answers %q (%v)", ms[0].Addr, out, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	base := doctorBase(t, shared, "locker", "doctor-pw")
	// The survivor refuses sessions: the driver's goes to the shared server.
	mixed := dial(t, []string{shared[0], ms[0].Addr}, WithRoot(base+"/mixed"))
	_, fs := diagnose(t, mixed, 0)
	out := false
	for _, f := range fs {
		if f.Check == "zk.mode" && strings.HasPrefix(f.What, ms[0].Addr+": not serving") && f.Level == backend.Warning {
			out = true
		}
	}
	if !out {
		t.Errorf("no warning for %s, out of its quorum: %+v", ms[0].Addr, fs)
	}
}
