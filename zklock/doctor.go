package zklock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
)

// Diagnose implements backend.Diagnoser: each server's mode ("srvr", the
// four-letter word allowed by default), the session timeout against ttl,
// the ensemble and the servers in the URL, the root's ACL and the
// credential. It changes nothing.
func (d *Driver) Diagnose(ctx context.Context, ttl time.Duration) ([]backend.Finding, error) {
	ctx, done, err := d.enter(ctx, "diagnose")
	if err != nil {
		return nil, err
	}
	defer done()
	fs := backend.Findings{Check: "zk."}
	servers := d.servers()

	// Each server's mode: one that serves no requests is out of the quorum.
	answered := map[string]bool{}
	for _, s := range servers {
		out, err := fourLetterWord(ctx, s, "srvr")
		mode, ok := "", false
		for _, line := range strings.Split(out, "\n") {
			if m, found := strings.CutPrefix(line, "Mode: "); found {
				mode, ok = strings.TrimSpace(m), true
			}
		}
		answered[s] = err == nil
		var op *net.OpError
		switch {
		case errors.As(err, &op) && op.Op == "dial":
			fs.Add("mode", backend.Warning, s+": unreachable: "+err.Error(),
				"a server down or cut off: the ensemble tolerates one failure fewer, and a standalone server none",
				"start it, or take it out of the URL if it left the ensemble")
		case err != nil:
			fs.Add("mode", backend.Warning, s+": cannot run the four-letter word srvr: "+err.Error(),
				"whether the server is in a quorum cannot be checked (a TLS-only port does not answer four-letter words in the clear)",
				"allow srvr in 4lw.commands.whitelist (it is by default) and reach the client port, or check `Mode:` by hand")
		case strings.Contains(out, "not in the whitelist"):
			fs.Add("mode", backend.Warning, s+": srvr is not in 4lw.commands.whitelist",
				"whether the server is in a quorum cannot be checked", "add srvr to 4lw.commands.whitelist in zoo.cfg")
		case !ok:
			line, _, _ := strings.Cut(out, "\n")
			fs.Add("mode", backend.Warning, s+": not serving requests ("+strings.TrimSpace(line)+")",
				"a server out of the quorum refuses every request: the ensemble tolerates one failure fewer, and sessions on it move or expire",
				"bring it back into the quorum (its log says why it is out)")
		case mode == "leader" || mode == "follower" || mode == "observer" || mode == "standalone":
			fs.Add("mode", backend.Sound, s+": "+mode, "", "")
		default:
			fs.Add("mode", backend.Warning, s+": mode "+mode,
				"a server in this mode may refuse writes, and so every lock", "bring it back into the quorum as a leader or follower")
		}
	}
	// A lock lives as long as the session, whatever its TTL; "conf" (if
	// allowed) says the server's bounds, for the fix.
	bounds := "the server's minSessionTimeout and maxSessionTimeout"
	// (Not of a server that did not answer srvr: a TLS port times out.)
	if cur := d.conn.Server(); answered[cur] {
		if out, err := fourLetterWord(ctx, cur, "conf"); err == nil {
			lo, hi := confField(out, "minSessionTimeout"), confField(out, "maxSessionTimeout")
			if lo != "" && hi != "" {
				bounds = fmt.Sprintf("the server's bounds [%sms, %sms]", lo, hi)
			}
		}
	}
	switch {
	case ttl <= 0 || d.ttl == ttl:
		fs.Add("session-timeout", backend.Sound, fmt.Sprintf("session timeout %v: every lock of this client lives as long as its session", d.ttl), "", "")
	default:
		why := "a lock lives as long as the session, not the TTL asked: a crashed holder's locks go after the session timeout, sooner than the TTL"
		if d.ttl > ttl {
			why = "a lock lives as long as the session, not the TTL asked: a crashed holder keeps others out for the session timeout, longer than the TTL"
		}
		fs.Add("session-timeout", backend.Warning, fmt.Sprintf("session timeout %v, lock TTL %v", d.ttl, ttl), why,
			fmt.Sprintf("ask session_timeout=%v in the URL, within %s (zoo.cfg), or a TTL of %v", ttl, bounds, d.ttl))
	}

	// The ensemble's voters, from /zookeeper/config (through the session,
	// so over TLS too; empty on a standalone server).
	cfg, err := call(ctx, d, func() ([]byte, error) {
		b, _, err := d.conn.Get("/zookeeper/config")
		return b, err
	})
	voters := 0
	for _, line := range strings.Split(string(cfg), "\n") {
		if _, v, ok := strings.Cut(line, "="); ok && strings.HasPrefix(line, "server.") {
			v, _, _ = strings.Cut(v, ";") // host:quorum:election[:role][;client]
			if !strings.HasSuffix(v, ":observer") {
				voters++
			}
		}
	}
	switch {
	case err != nil:
		fs.Add("ensemble", backend.Warning, "cannot read /zookeeper/config: "+err.Error(),
			"whether the ensemble tolerates a server's failure cannot be checked", "give the credential READ on /zookeeper/config (world:anyone:r by default)")
	case voters <= 1:
		fs.Add("ensemble", backend.Warning, "a standalone server (/zookeeper/config lists no other voting member)",
			"no fault tolerance: while it is down nothing can be locked, and a holder whose session it cannot renew loses its lock",
			"an ensemble of 3 or 5 servers, all of them in the URL")
	case voters == 2:
		fs.Add("ensemble", backend.Warning, "an ensemble of 2 voting members",
			"a majority of 2 is 2: when either server fails, nothing can be locked, and holders lose their locks after the session timeout",
			"3 or 5 voting members")
	case d.own && len(servers) == 1:
		// With New, the caller's connection may know more servers.
		fs.Add("ensemble", backend.Warning, fmt.Sprintf("%s: the only server in the URL, of an ensemble of %d", servers[0], voters),
			"when it fails, the client cannot move its session to another server, and its locks are lost after the session timeout",
			"list every server of the ensemble in the URL (zk://zk1:2181,zk2:2181,zk3:2181/...)")
	case d.own:
		fs.Add("ensemble", backend.Sound, fmt.Sprintf("an ensemble of %d voting members, %d servers in the URL", voters, len(servers)), "", "")
	default:
		fs.Add("ensemble", backend.Sound, fmt.Sprintf("an ensemble of %d voting members", voters), "", "")
	}

	// The root's ACL, which every node under it gets, and against which
	// ZooKeeper checks deletes.
	acl, err := call(ctx, d, func() ([]zk.ACL, error) {
		acl, _, err := d.conn.GetACL(d.root)
		return acl, err
	})
	switch {
	case errors.Is(err, zk.ErrNoAuth):
		fs.Add("acl", backend.Warning, d.root+": cannot read its ACL",
			"whether others may delete a holder's node cannot be checked", "give the credential READ on "+d.root)
	case errors.Is(err, zk.ErrNoNode):
		fs.Add("acl", backend.Sound, d.root+": deleted since Open; the next acquisition makes it again with "+formatACL(d.acl), "", "")
	case err != nil:
		return nil, fmt.Errorf("zklock: diagnose: read the ACL of %s: %w", d.root, err)
	default:
		var world int32
		for _, x := range acl {
			if x.Scheme == "world" && x.ID == "anyone" {
				world |= x.Perms
			}
		}
		switch {
		case world&(zk.PermDelete|zk.PermWrite|zk.PermAdmin) != 0:
			fs.Add("acl", backend.Unsafe, d.root+": ACL "+formatACL(acl)+": anyone who can reach the server may write or delete the lock nodes",
				"anyone can delete or overwrite a holder's node and so let a second holder in (the first is told, a round trip later)",
				"a credential: zk://user:password@... (the driver then gives its nodes DigestACL), and a root with that ACL (see docs/backends/zklock.md, ACLs)")
		case world&zk.PermCreate != 0:
			fs.Add("acl", backend.Warning, d.root+": ACL "+formatACL(acl)+": anyone may create under the root",
				"anyone can make a name's node with an ACL the driver refuses, and so deny that name to every client",
				"drop CREATE for world:anyone (zkCli: setAcl "+d.root+" ...)")
		default:
			fs.Add("acl", backend.Sound, d.root+": ACL "+formatACL(acl), "", "")
		}
	}

	// A credential, where the connection leaves this host (with New, the
	// driver cannot tell).
	if d.own {
		remote := backend.Remote(servers)
		switch {
		case d.digest != "":
			user, _, _ := strings.Cut(d.digest, ":")
			fs.Add("auth", backend.Sound, "authenticates as the digest user "+user, "", "")
		case len(remote) > 0:
			fs.Add("auth", backend.Warning, remote[0]+": no credential, to a server on another host",
				"every client that reaches the server has the same rights on the locks as this one",
				"a user and password in the URL (zk://user:password@...), and TLS")
		default:
			fs.Add("auth", backend.Sound, "no credential, to servers on this host only", "", "")
		}
	}
	return fs.List, nil
}

// StoreTime implements backend.StoreClock: the leader's stamp on a
// transaction that makes, writes and deletes an ephemeral node under the
// root ('~': no lock name's). It needs CREATE, WRITE and DELETE there.
func (d *Driver) StoreTime(ctx context.Context) (time.Time, error) {
	ctx, done, err := d.enter(ctx, "store time")
	if err != nil {
		return time.Time{}, err
	}
	defer done()
	var b [8]byte
	_, _ = rand.Read(b[:])
	p := d.root + "/~clock-" + hex.EncodeToString(b[:])
	res, err := call(ctx, d, func() ([]zk.MultiResponse, error) {
		return d.conn.Multi(
			&zk.CreateRequest{Path: p, Data: []byte{}, Acl: d.acl, Flags: zk.FlagEphemeral},
			&zk.SetDataRequest{Path: p, Data: []byte{}, Version: -1},
			&zk.DeleteRequest{Path: p, Version: -1},
		)
	})
	for _, r := range res {
		if err == nil && r.Error != nil {
			err = r.Error
		}
	}
	if err == nil && (len(res) != 3 || res[1].Stat == nil) {
		err = errors.New("no stat in the transaction's answer")
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("zklock: read the store's clock: %w", permitted(err))
	}
	return time.UnixMilli(res[1].Stat.Mtime), nil
}

// servers are those the driver may connect to: its own connection's, else
// the one the caller's is on.
func (d *Driver) servers() []string {
	if d.hosts != nil {
		d.hosts.mu.Lock()
		defer d.hosts.mu.Unlock()
		if len(d.hosts.servers) > 0 {
			return append([]string(nil), d.hosts.servers...)
		}
	}
	if s := d.conn.Server(); s != "" {
		return []string{s}
	}
	return nil
}

// fourLetterWord sends word to addr and returns the answer, within 2 s.
func fourLetterWord(ctx context.Context, addr, word string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if _, err := io.WriteString(c, word); err != nil {
		return "", err
	}
	out, err := io.ReadAll(io.LimitReader(c, 1<<16))
	if err == nil && len(out) == 0 {
		err = io.ErrUnexpectedEOF
	}
	return string(out), err
}

// confField returns a "name=value" line's value in a conf answer.
func confField(out, name string) string {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+"="); ok {
			return v
		}
	}
	return ""
}
