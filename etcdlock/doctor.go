package etcdlock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/parallel"
)

// No backend.StoreClock: etcd tells no time, and leases count durations
// on the leader's clock, so no lock depends on our clock's offset.
var _ backend.Diagnoser = (*Driver)(nil)

// maxRaftGap is etcd's maxGapBetweenApplyAndCommitIndex: a member that
// far behind in applying refuses new requests ("too many requests").
const maxRaftGap = 5000

// statusTimeout bounds the Status of one member, down or not.
const statusTimeout = 3 * time.Second

// Diagnose implements backend.Diagnoser: the members (how many, each one's
// health, leader and raft progress), the alarms, authentication and the
// credential's roles, and the lease etcd grants for ttl, if given: its one
// write, revoked at once, since etcd tells its minimum TTL nowhere else.
func (d *Driver) Diagnose(ctx context.Context, ttl time.Duration) ([]backend.Finding, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: diagnose: %w", err)
	}
	defer done()
	fs := backend.Findings{Check: "etcd."}
	ml, err := d.cli.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: diagnose: %w", err)
	}
	voters := 0
	for _, m := range ml.Members {
		if !m.IsLearner {
			voters++
		}
	}
	switch {
	case voters == 1:
		fs.Add("members", backend.Warning, "a single member",
			"while it is down no lock can be taken or kept, and if its data directory is lost a new one counts revisions from 1 again, so fences go back",
			"run 3 (or 5) members")
	case voters%2 == 0:
		fs.Add("members", backend.Warning, fmt.Sprintf("%d voting members, an even number", voters),
			fmt.Sprintf("a quorum is %d, so it tolerates no more members down than %d would, and a partition can split it with no quorum on either side", voters/2+1, voters-1),
			"add or remove one member: 3 or 5")
	default:
		fs.Add("members", backend.Sound, fmt.Sprintf("%d voting members: locks survive %d down", voters, voters/2), "", "")
	}
	d.members(ctx, ml.Members, &fs)

	if al, err := d.cli.AlarmList(ctx); err != nil {
		fs.Add("alarms", backend.Warning, "cannot list the alarms: "+err.Error(), "a full or corrupt database cannot be seen",
			"run etcdctl alarm list by hand")
	} else if len(al.Alarms) == 0 {
		fs.Add("alarms", backend.Sound, "no alarm", "", "")
	} else {
		for _, a := range al.Alarms {
			who := memberName(ml.Members, a.MemberID)
			switch a.Alarm {
			case pb.AlarmType_NOSPACE:
				fs.Add("alarms", backend.Unsafe, who+": NOSPACE, the database is over its quota",
					"etcd refuses every write and lease grant until the alarm is disarmed: no lock can be taken, no waiter can queue",
					"etcdctl compact and etcdctl defrag (and raise --quota-backend-bytes if the data needs it), then etcdctl alarm disarm")
			case pb.AlarmType_CORRUPT:
				fs.Add("alarms", backend.Unsafe, who+": CORRUPT, its data differs from the other members'",
					"which entries hold a lock is in doubt, and etcd refuses requests until the member is replaced",
					"remove the member, wipe its data directory, add it back, then etcdctl alarm disarm")
			default:
				fs.Add("alarms", backend.Warning, who+": alarm "+a.Alarm.String(), "etcd may refuse requests while it is raised",
					"see etcd's documentation for the alarm, then etcdctl alarm disarm")
			}
		}
	}

	d.auth(ctx, &fs)

	if ttl > 0 {
		if err := d.minLease(ctx, ttl, &fs); err != nil {
			return nil, fmt.Errorf("etcdlock: diagnose: %w", err)
		}
	}
	return fs.List, nil
}

// members asks each member its Status: whether it answers, its errors,
// its leader and term, and how far its raft log is behind the leader's.
func (d *Driver) members(ctx context.Context, ms []*pb.Member, fs *backend.Findings) {
	sts := make([]*clientv3.StatusResponse, len(ms))
	errs := parallel.Each(len(ms), len(ms), func(i int) (err error) {
		if len(ms[i].ClientURLs) == 0 {
			return errors.New("it has not started (no client URL)")
		}
		ctx, cancel := context.WithTimeout(ctx, statusTimeout)
		defer cancel()
		sts[i], err = d.cli.Status(ctx, ms[i].ClientURLs[0])
		return err
	})

	leaders := map[uint64][]string{} // leader ID → the members that name it
	var leaderIndex uint64
	for i, m := range ms {
		who := memberName(ms, m.ID)
		st := sts[i]
		switch {
		case errs[i] != nil:
			fs.Add("health", backend.Warning, who+" does not answer: "+errs[i].Error(),
				"the cluster tolerates one member fewer down, and clients sent to it fail over",
				"restart the member, or check that its advertised client URL is reachable from this host")
			continue
		case len(errsBut(st.Errors, "alarm:")) > 0:
			fs.Add("health", backend.Warning, who+" reports: "+strings.Join(errsBut(st.Errors, "alarm:"), "; "),
				"it may refuse requests", "see the member's log")
		case st.Leader == 0:
			fs.Add("health", backend.Warning, who+" has no leader",
				"it refuses every lock request, and keep-alives through it fail",
				"check the network between the members")
		default:
			fs.Add("health", backend.Sound, fmt.Sprintf("%s answers, leader %s, term %d", who, memberName(ms, st.Leader), st.RaftTerm), "", "")
		}
		if st.Leader != 0 {
			leaders[st.Leader] = append(leaders[st.Leader], m.Name)
		}
		if st.Header != nil && st.Leader == st.Header.MemberId {
			leaderIndex = st.RaftIndex
		}
	}
	answered := slices.ContainsFunc(sts, func(st *clientv3.StatusResponse) bool { return st != nil })
	switch {
	case !answered:
		fs.Add("leader", backend.Warning, "no member answered at its advertised client URL: the leader is not checked",
			"a cluster without a leader refuses every lock", "run doctor where the members' advertised client URLs are reachable")
	case len(leaders) == 0:
		fs.Add("leader", backend.Unsafe, "no member has a leader",
			"every lock request and keep-alive fails; held locks are lost a TTL later",
			"restore a quorum: start the members that are down, check the network between them")
	case len(leaders) == 1:
		for id := range leaders {
			fs.Add("leader", backend.Sound, "one leader: "+memberName(ms, id), "", "")
		}
	default:
		var says []string
		for id, by := range leaders {
			says = append(says, strings.Join(by, ", ")+" follow "+memberName(ms, id))
		}
		slices.Sort(says)
		fs.Add("leader", backend.Warning, "the members disagree on the leader: "+strings.Join(says, "; "),
			"an election is under way or a member is cut off, and requests through a member that follows an old leader fail",
			"run doctor again; if it persists, check the network between the members")
	}
	for i, m := range ms {
		st := sts[i]
		if st == nil {
			continue
		}
		who := memberName(ms, m.ID)
		behind := int64(leaderIndex) - int64(st.RaftIndex)
		unapplied := int64(st.RaftIndex) - int64(st.RaftAppliedIndex)
		if leaderIndex == 0 {
			behind = 0
		}
		if behind > maxRaftGap || unapplied > maxRaftGap {
			fs.Add("raft-lag", backend.Warning, fmt.Sprintf("%s is %d entries behind the leader, %d committed but not applied", who, behind, unapplied),
				fmt.Sprintf("requests through it wait for it to catch up, and past %d unapplied entries it refuses them", maxRaftGap),
				"check its disk (fsync latency) and its network to the leader")
		} else {
			fs.Add("raft-lag", backend.Sound, fmt.Sprintf("%s is %d entries behind the leader, %d unapplied", who, max(behind, 0), max(unapplied, 0)), "", "")
		}
	}
}

// errsBut is errs but those that contain s (the alarms, said apart).
func errsBut(errs []string, s string) []string {
	return slices.DeleteFunc(slices.Clone(errs), func(e string) bool { return strings.Contains(e, s) })
}

// memberName is a member's name and client URL, or its ID.
func memberName(ms []*pb.Member, id uint64) string {
	for _, m := range ms {
		if m.ID == id && m.Name != "" {
			if len(m.ClientURLs) > 0 {
				return m.Name + " (" + m.ClientURLs[0] + ")"
			}
			return m.Name
		}
	}
	return fmt.Sprintf("member %x", id)
}

// auth checks that authentication is on for a cluster reached over the
// network, and that the credential's roles reach nothing beyond the prefix.
func (d *Driver) auth(ctx context.Context, fs *backend.Findings) {
	on, err := authEnabled(ctx, d.cli)
	if err != nil {
		fs.Add("auth", backend.Warning, "cannot tell whether authentication is on: "+err.Error(),
			"without it, whoever reaches the cluster can take any lock", "run etcdctl auth status by hand")
		return
	}
	if !on {
		if remote := backend.Remote(d.cli.Endpoints()); len(remote) > 0 {
			fs.Add("auth", backend.Warning, "authentication is off, and the cluster is reached over the network ("+strings.Join(remote, ", ")+")",
				"whoever reaches the port can delete any lock's entry or revoke its holder's lease, and take the lock",
				"enable authentication (etcdctl user add root, etcdctl auth enable) with a user for the locks: docs/backends/etcdlock.md, Least privilege")
		} else {
			fs.Add("auth", backend.Sound, "authentication is off, on loopback only", "", "")
		}
		return
	}
	fs.Add("auth", backend.Sound, "authentication is on", "", "")
	user := d.cli.Username
	if user == "" {
		fs.Add("roles", backend.Warning, "the roles of the client certificate's user are not checked",
			"a role beyond the lock prefix lets a leaked lock credential change other data",
			"check by hand: etcdctl user get CN --detail")
		return
	}
	u, err := d.cli.UserGet(ctx, user)
	if err != nil {
		fs.Add("roles", backend.Warning, fmt.Sprintf("cannot read user %q: %v", user, err),
			"its roles cannot be checked", "check by hand: etcdctl user get "+user+" --detail")
		return
	}
	prefix := d.prefix + "/"
	end := clientv3.GetPrefixRangeEnd(prefix)
	var beyond []string
	for _, r := range u.Roles {
		if r == "root" {
			beyond = append(beyond, "role root (everything, including auth itself)")
			continue
		}
		rg, err := d.cli.RoleGet(ctx, r)
		if err != nil {
			fs.Add("roles", backend.Warning, fmt.Sprintf("cannot read role %q: %v", r, err),
				"its permissions cannot be checked", "check by hand: etcdctl role get "+r)
			continue
		}
		for _, p := range rg.Perm {
			if !within(p, prefix, end) {
				beyond = append(beyond, fmt.Sprintf("role %s: %s %s", r, p.PermType, permRange(p)))
			}
		}
	}
	if len(beyond) > 0 {
		fs.Add("roles", backend.Warning, fmt.Sprintf("user %q may reach beyond %s: %s", user, prefix, strings.Join(beyond, "; ")),
			"a leaked lock credential can then read or change data that locks do not need",
			"grant the user one role with readwrite --prefix=true "+prefix+" only (docs/backends/etcdlock.md, Least privilege)")
	} else {
		fs.Add("roles", backend.Sound, fmt.Sprintf("user %q reaches nothing beyond %s", user, prefix), "", "")
	}
}

// authEnabled asks AuthStatus (etcd 3.5+), else RoleList, refused only
// to a user other than root while auth is on (a user name alone proves
// nothing: the client keeps one that auth off refused).
func authEnabled(ctx context.Context, cli *clientv3.Client) (bool, error) {
	st, err := cli.AuthStatus(ctx)
	if err == nil {
		return st.Enabled, nil
	}
	if status.Code(err) != codes.Unimplemented {
		return false, err
	}
	_, err = cli.RoleList(ctx)
	switch {
	case errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied):
		return true, nil
	case err != nil:
		return false, err
	case cli.Username == "":
		return false, nil // anonymous, and allowed
	}
	u, err := cli.UserGet(ctx, cli.Username)
	if errors.Is(rpctypes.Error(err), rpctypes.ErrUserNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return slices.Contains(u.Roles, "root"), nil
}

// within reports whether a permission covers only keys under prefix
// (whose range ends at end). RangeEnd "" is the key alone; "\x00" is
// every key from Key on.
func within(p *authpb.Permission, prefix, end string) bool {
	if !bytes.HasPrefix(p.Key, []byte(prefix)) {
		return false
	}
	return len(p.RangeEnd) == 0 || (string(p.RangeEnd) != "\x00" && string(p.RangeEnd) <= end)
}

// permRange shows a permission's keys as etcdctl takes them.
func permRange(p *authpb.Permission) string {
	switch {
	case len(p.RangeEnd) == 0:
		return fmt.Sprintf("%q", p.Key)
	case string(p.RangeEnd) == "\x00":
		return fmt.Sprintf("every key from %q", p.Key)
	case string(p.RangeEnd) == clientv3.GetPrefixRangeEnd(string(p.Key)):
		return fmt.Sprintf("prefix %q", p.Key)
	}
	return fmt.Sprintf("[%q, %q)", p.Key, p.RangeEnd)
}

// minLease grants a lease for ttl, as the driver would, and revokes it:
// etcd raises a TTL below its minimum (1.5 election timeouts) silently.
func (d *Driver) minLease(ctx context.Context, ttl time.Duration, fs *backend.Findings) error {
	sec, err := ttlSeconds(ttl)
	if err != nil {
		return err
	}
	g, err := d.cli.Grant(ctx, sec)
	if err != nil {
		fs.Add("lease-ttl", backend.Warning, "cannot grant a lease: "+err.Error(),
			"the TTL etcd gives locks is not checked", "run doctor again once the cluster takes requests")
		return nil
	}
	// Revoked even if ctx ends; a lease not revoked expires on its own.
	d.revoke(context.WithoutCancel(ctx), g.ID)
	asked := fmt.Sprintf("a lease for a TTL of %v", ttl)
	if time.Duration(sec)*time.Second != ttl {
		asked += fmt.Sprintf(" (%ds: leases are whole seconds)", sec)
	}
	if g.TTL > sec {
		fs.Add("lease-ttl", backend.Warning, fmt.Sprintf("etcd grants %s as %ds, its minimum", asked, g.TTL),
			fmt.Sprintf("a lock whose holder dies stays taken for %ds, not %v", g.TTL, ttl),
			fmt.Sprintf("a TTL of at least %ds, or a shorter --election-timeout on the members (the minimum is 1.5 times it)", g.TTL))
	} else {
		fs.Add("lease-ttl", backend.Sound, fmt.Sprintf("etcd grants %s as asked", asked), "", "")
	}
	return nil
}
