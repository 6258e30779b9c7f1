package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
)

// Lock-delay (backend.Delayer; see docs/backends/zklock.md, Lock-delay):
// an acquisition with a delay also makes, in the create's multi-op, a
// persistent marker "dl-" + its token's hash, which its driver deletes
// with the node. A marker with no node of its hash is a lost lock's: the
// first claim to find it stamps it (a versioned write: its mtime is the
// server's clock, after the session's end), and it keeps the name until
// the server's clock reads the stamp plus the delay (a probe write reads
// it), when a claim deletes it. A waiting claim marks its marker waiting
// until its grant: lost before, it delays nobody.

// KeepsDelay implements backend.Delayer: every server has what the marker
// needs.
func (d *Driver) KeepsDelay() bool { return true }

const markerPrefix = "dl-"

// marks reports whether l's node is made with a marker.
func (d *Driver) marks(l backend.Claim) bool { return l.Delay > 0 && !d.testNoMarker }

// markerHash is the token hash of a marker's name; false for other nodes.
func markerHash(name string) (string, bool) {
	h, ok := strings.CutPrefix(name, markerPrefix)
	return h, ok && len(h) == hashLen
}

// A marker's data: its state, the delay in ms, a newline, the owner. The
// states: held (its node holds, held when its session ended, or is new),
// lost (stamped at its mtime), waiting (lost, it delays nobody).
const (
	markHeld    = 'h'
	markLost    = 'l'
	markWaiting = 'w'
)

func markerData(state byte, delay time.Duration, owner string) []byte {
	ms := (delay + time.Millisecond - 1) / time.Millisecond
	return append(strconv.AppendInt([]byte{state}, int64(ms), 10), "\n"+owner...)
}

func parseMarker(data []byte) (state byte, delay time.Duration, owner string, ok bool) {
	head, owner, found := strings.Cut(string(data), "\n")
	if !found || len(head) < 2 || !strings.ContainsRune("hlw", rune(head[0])) {
		return 0, 0, "", false
	}
	ms, err := strconv.ParseInt(head[1:], 10, 64)
	if err != nil || ms < 0 {
		return 0, 0, "", false
	}
	return head[0], time.Duration(ms) * time.Millisecond, owner, true
}

// markerOps are the create's ops that make l's marker, or, with reuse,
// reset the one an earlier session's node of its token left.
func (d *Driver) markerOps(parent, hash string, l backend.Claim, reuse bool) []any {
	if !d.marks(l) {
		return nil
	}
	path, data := parent+"/"+markerPrefix+hash, markerData(markHeld, l.Delay, l.Owner)
	if reuse {
		return []any{&zk.SetDataRequest{Path: path, Data: data, Version: -1}}
	}
	return []any{&zk.CreateRequest{Path: path, Data: data, Acl: d.acl}}
}

// deadMarkers are the markers of a listing with no node of their token:
// lost locks' (or, rarely, lost waiters').
func deadMarkers(nodes []qnode, markers []string) []string {
	var dead []string
	for _, m := range markers {
		h, _ := markerHash(m)
		if !slices.ContainsFunc(nodes, func(n qnode) bool { return hashOf(n.name) == h }) {
			dead = append(dead, m)
		}
	}
	return dead
}

// errMarkerChanged: a marker was written while judged; judge it again.
var errMarkerChanged = errors.New("a delay marker changed while judged")

// judgeMarker says how long the dead marker name under parent still keeps
// the name from a claim whose node's zxid is fence (by the server's clock;
// 0 once gone). The first to judge it stamps it; it is deleted once its
// delay passed, or at once if made after the claim's node (a waiter's).
func (d *Driver) judgeMarker(ctx context.Context, parent, name string, fence uint64) (time.Duration, error) {
	path := parent + "/" + name
	for range 3 {
		left, err := d.judgeOnce(ctx, parent, path, fence)
		if !errors.Is(err, errMarkerChanged) {
			return left, err
		}
	}
	return 0, fmt.Errorf("%w: %s", errMarkerChanged, path)
}

func (d *Driver) judgeOnce(ctx context.Context, parent, path string, fence uint64) (time.Duration, error) {
	r, err := call(ctx, d, func() (getResult, error) { return d.get(path) })
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	state, delay, owner, ok := parseMarker(r.data)
	lost := state == markLost
	if !ok || state == markWaiting || fence != 0 && uint64(r.st.Czxid) > fence {
		return 0, d.dropMarker(ctx, path, r.st.Version) // nothing to heed
	}
	stamp := r.st
	var now *zk.Stat
	if !lost {
		now, err = d.set(ctx, path, markerData(markLost, delay, owner), r.st.Version)
		stamp = now
	} else {
		now, err = d.set(ctx, parent, []byte{}, -1) // a probe: the server's clock
	}
	switch {
	case errors.Is(err, zk.ErrNoNode) && !lost:
		return 0, nil
	case errors.Is(err, zk.ErrBadVersion):
		return 0, errMarkerChanged
	case err != nil:
		return 0, err
	}
	if left := time.Duration(stamp.Mtime-now.Mtime)*time.Millisecond + delay; left > 0 {
		return left, nil
	}
	return 0, d.dropMarker(ctx, path, stamp.Version)
}

// set writes a node's data, and returns its stat.
func (d *Driver) set(ctx context.Context, path string, data []byte, version int32) (*zk.Stat, error) {
	return call(ctx, d, func() (*zk.Stat, error) {
		return request(d, func() (*zk.Stat, error) { return d.conn.Set(path, data, version) })
	})
}

// dropMarker deletes a marker judged over, unless it was written since.
func (d *Driver) dropMarker(ctx context.Context, path string, version int32) error {
	_, err := call(ctx, d, func() (struct{}, error) {
		return request(d, func() (struct{}, error) { return struct{}{}, d.conn.Delete(path, version) })
	})
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return nil
	case errors.Is(err, zk.ErrBadVersion):
		return errMarkerChanged
	}
	return err
}

// setWaiting marks t's marker waiting, so that it delays nobody if its
// session ends before its turn; grant marks it held. A failure leaves it
// held: a delay after such a loss, as without this.
func (t *ticket) setWaiting(ctx context.Context) {
	e := t.e
	if !e.marked || e.waiting {
		return
	}
	if _, err := t.d.set(ctx, e.marker(), markerData(markWaiting, t.l.Delay, t.l.Owner), -1); err == nil {
		e.waiting = true
	}
}

// setHeld marks e's marker held and checks e's node is there (confirm).
func (d *Driver) setHeld(ctx context.Context, e *entry, l backend.Claim) error {
	_, err := callInline(ctx, d, func() ([]zk.MultiResponse, error) {
		return request(d, func() ([]zk.MultiResponse, error) {
			return d.conn.Multi(&zk.CheckVersionRequest{Path: e.path(), Version: -1},
				&zk.SetDataRequest{Path: e.marker(), Data: markerData(markHeld, l.Delay, l.Owner), Version: -1})
		})
	})
	if errors.Is(err, zk.ErrNoNode) {
		return errGone
	}
	if err == nil {
		e.waiting = false
	}
	return err
}

// deleteWith deletes a node of ours, and its marker if any, in one request.
func (d *Driver) deleteWith(path, marker string, version int32) error {
	if marker == "" {
		return d.conn.Delete(path, version)
	}
	_, err := d.conn.Multi(&zk.DeleteRequest{Path: path, Version: version}, &zk.DeleteRequest{Path: marker, Version: -1})
	if errors.Is(err, zk.ErrNoNode) {
		// The marker went (broken): the node goes alone. A node gone
		// (lost) leaves its marker to keep the delay.
		err = d.conn.Delete(path, version)
	}
	return err
}
