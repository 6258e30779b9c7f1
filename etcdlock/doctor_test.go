package etcdlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// diagnose runs d's Diagnose with ttl and returns its findings and each
// check's level (the worst, where a check reports per member).
func diagnose(t *testing.T, d *Driver, ttl time.Duration) ([]backend.Finding, map[string]backend.Level) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fs, err := d.Diagnose(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]backend.Level{}
	for _, f := range fs {
		t.Logf("%-7v %s: %s", f.Level, f.Check, f.What)
		if f.Level != backend.Sound && (f.Why == "" || f.Fix == "") {
			t.Errorf("%s: %v without why or fix: %+v", f.Check, f.Level, f)
		}
		got[f.Check] = max(got[f.Check], f.Level)
	}
	return fs, got
}

// open is Open on URL, closed at the end of the test.
func open(t *testing.T, url string) *Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func want(t *testing.T, where string, got map[string]backend.Level, wants map[string]backend.Level) {
	t.Helper()
	for c, l := range wants {
		if g, ok := got[c]; !ok || g != l {
			t.Errorf("%s: %s %v (reported %v), want %v", where, c, g, ok, l)
		}
	}
}

// The shared single member is sound but for being alone, and raises a 1 s
// lease to its 2 s minimum; the shared cluster of three is sound.
func TestDiagnose(t *testing.T) {
	single, cluster := testenv.EtcdEndpoints(), testenv.EtcdClusterEndpoints()
	testenv.Require(t, append(single, cluster...)...)
	d := open(t, "etcd://"+strings.Join(single, ",")+"/locker-doctor")
	_, got := diagnose(t, d, time.Second)
	want(t, "single", got, map[string]backend.Level{"etcd.members": backend.Warning, "etcd.health": backend.Sound,
		"etcd.leader": backend.Sound, "etcd.raft-lag": backend.Sound, "etcd.alarms": backend.Sound,
		"etcd.auth": backend.Sound, "etcd.lease-ttl": backend.Warning})
	if hasCheck(got, "etcd.roles") {
		t.Errorf("single: roles checked with auth off")
	}
	_, got = diagnose(t, d, 30*time.Second)
	want(t, "single, 30s", got, map[string]backend.Level{"etcd.lease-ttl": backend.Sound})
	if _, got = diagnose(t, d, 0); hasCheck(got, "etcd.lease-ttl") {
		t.Errorf("ttl 0: the lease checked with no TTL")
	}

	// A user in the URL with auth off: the client goes on without a token,
	// and auth is still seen off.
	d = open(t, "etcd://nobody:pw@"+strings.Join(single, ",")+"/locker-doctor")
	if _, got = diagnose(t, d, 0); got["etcd.auth"] != backend.Sound || hasCheck(got, "etcd.roles") {
		t.Errorf("a user with auth off: auth %v, roles checked %v", got["etcd.auth"], hasCheck(got, "etcd.roles"))
	}

	d = open(t, "etcd://"+strings.Join(cluster, ",")+"/locker-doctor")
	fs, got := diagnose(t, d, 30*time.Second)
	want(t, "cluster", got, map[string]backend.Level{"etcd.members": backend.Sound, "etcd.health": backend.Sound,
		"etcd.leader": backend.Sound, "etcd.raft-lag": backend.Sound, "etcd.alarms": backend.Sound})
	n := 0
	for _, f := range fs {
		if f.Check == "etcd.health" {
			n++
		}
	}
	if n != 3 {
		t.Errorf("cluster: %d health findings, want one per member (3)", n)
	}
}

// A database over its quota raises NOSPACE: unsafe. Open itself then
// fails (its access check is a transaction with a put), so the driver is
// made with New.
func TestDiagnoseNoSpace(t *testing.T) {
	s := testenv.StartEtcdWith(t, "--quota-backend-bytes", "262144")
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	big := strings.Repeat("x", 64<<10)
	for i := 0; ; i++ {
		_, err := cli.Put(ctx, "/fill/"+string(rune('a'+i%26))+strings.Repeat("-", i/26), big)
		if errors.Is(err, rpctypes.ErrNoSpace) {
			break
		}
		if err != nil || i == 200 {
			t.Fatalf("filling 256 KiB: put %d: %v", i, err)
		}
	}
	if d, err := Open(ctx, "etcd://"+s.Addr+"/locker-doctor"); err == nil {
		d.Close()
		t.Errorf("Open succeeded on a cluster without space")
	} else if !strings.Contains(err.Error(), "NOSPACE") || strings.Contains(err.Error(), "not reachable") {
		t.Errorf("Open on a cluster without space: %v; want it to say NOSPACE, not unreachable", err)
	}
	d := mustNew(t, cli, WithPrefix("/locker-doctor"))
	defer d.Close()
	_, got := diagnose(t, d, 30*time.Second)
	want(t, "nospace", got, map[string]backend.Level{"etcd.alarms": backend.Unsafe, "etcd.lease-ttl": backend.Warning})
}

// A member that does not answer is a warning; so is an even member count
// (the same cluster once that member is removed).
func TestDiagnoseDownAndEven(t *testing.T) {
	ms := testenv.StartEtcdCluster(t, 3)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ms[0].Addr, ms[1].Addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	d := mustNew(t, cli, WithPrefix("/locker-doctor"))
	defer d.Close()
	_, got := diagnose(t, d, 30*time.Second)
	want(t, "three members", got, map[string]backend.Level{"etcd.members": backend.Sound, "etcd.health": backend.Sound,
		"etcd.leader": backend.Sound, "etcd.alarms": backend.Sound})

	// Diagnose's one write, the lease, is gone: revoked, not left to its
	// 30s TTL. The member that answers Leases may be a follower that has
	// not applied the revocation yet, so a few looks, well within the TTL.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for look := 0; ; look++ {
		ls, err := cli.Leases(ctx)
		if err == nil && len(ls.Leases) == 0 {
			break
		}
		if look == 50 {
			t.Errorf("leases left 5s after Diagnose (TTL 30s): %v, %v", ls, err)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A follower, so that no election follows.
	st, err := cli.Status(ctx, ms[0].Addr)
	if err != nil {
		t.Fatal(err)
	}
	ml, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var victim *testenv.Server
	var victimID uint64
	for _, m := range ml.Members {
		for _, s := range ms {
			if m.ID != st.Leader && len(m.ClientURLs) > 0 && strings.HasSuffix(m.ClientURLs[0], "//"+s.Addr) {
				victim, victimID = s, m.ID
			}
		}
	}
	if victim == nil {
		t.Fatalf("no follower among %v", ml.Members)
	}
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	fs, got := diagnose(t, d, 0)
	want(t, "one down", got, map[string]backend.Level{"etcd.members": backend.Sound, "etcd.leader": backend.Sound,
		"etcd.alarms": backend.Sound})
	var down []string
	for _, f := range fs {
		if f.Check == "etcd.health" && f.Level == backend.Warning && strings.Contains(f.What, "does not answer") {
			down = append(down, f.What)
		}
	}
	if len(down) != 1 || !strings.Contains(down[0], victim.Addr) {
		t.Errorf("the killed member %s: reported down %q, want it alone", victim.Addr, down)
	}

	if _, err := cli.MemberRemove(ctx, victimID); err != nil {
		t.Fatal(err)
	}
	_, got = diagnose(t, d, 0)
	want(t, "two members", got, map[string]backend.Level{"etcd.members": backend.Warning, "etcd.health": backend.Sound,
		"etcd.leader": backend.Sound})
}

// With auth on, a user whose one role is readwrite on the prefix is sound;
// one more permission elsewhere, or the prefix without its slash, is a
// warning that names it.
func TestDiagnoseRoles(t *testing.T) {
	s := newSecure(t)
	prefix := s.prefix(t)
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	for _, c := range []struct {
		name   string
		perms  []perm
		level  backend.Level
		naming string
	}{
		{"least", []perm{{rw, prefix + "/", true}}, backend.Sound, ""},
		{"other key", []perm{{rw, prefix + "/", true}, {clientv3.PermissionType(clientv3.PermRead), "/config/db", false}}, backend.Warning, `"/config/db"`},
		{"no slash", []perm{{rw, prefix, true}}, backend.Warning, `prefix "` + prefix + `"`},
		{"root", []perm{{rw, prefix + "/", true}}, backend.Warning, "role root"},
	} {
		user, pw := s.user(t, c.perms...)
		if c.name == "root" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := s.admin.UserGrantRole(ctx, user, "root")
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		d := open(t, s.url(user, pw, prefix))
		fs, got := diagnose(t, d, 0)
		want(t, c.name, got, map[string]backend.Level{"etcd.auth": backend.Sound, "etcd.roles": c.level})
		for _, f := range fs {
			if f.Check == "etcd.roles" && !strings.Contains(f.What, c.naming) {
				t.Errorf("%s: %q does not name %s", c.name, f.What, c.naming)
			}
		}
	}
}

func hasCheck(got map[string]backend.Level, c string) bool { _, ok := got[c]; return ok }
