package zklock

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
)

// A lock node is named "lk-" + its token's hash + "-" + the sequence
// number: the hash finds a node whose create's answer was lost, and proves
// a token owns a node without showing the token.
const (
	nodePrefix = "lk-"
	hashLen    = 32
)

// errGone: our queue node is not there any more.
var errGone = errors.New("queue node gone")

func tokenHash(token string) string {
	var buf [96]byte // on the stack for the usual tokens
	sum := sha256.Sum256(append(append(buf[:0], "zklock\x00"...), token...))
	return hex.EncodeToString(sum[:hashLen/2])
}

// entry is one queue node.
type entry struct {
	parent  string
	name    string
	full    string // parent + "/" + name, when known (path)
	hash    string // its token's
	seq     int64
	first   bool   // known to be the lowest node (shared: known to hold)
	fence   uint64 // the node's creation zxid
	session int64  // the session that owns it
	marked  bool   // made with a delay marker (delay.go)
	waiting bool   // its marker says it waits
}

// marker is the path of e's delay marker, "" when it has none.
func (e *entry) marker() string {
	if !e.marked {
		return ""
	}
	return e.parent + "/" + markerPrefix + e.hash
}

func (e *entry) path() string {
	if e.full != "" {
		return e.full
	}
	return e.parent + "/" + e.name
}

// held is a granted lock.
type held struct {
	path    string
	marker  string // its delay marker's path, if any
	session int64
	onLost  func(error)
	lost    bool
	done    bool      // released, or the driver closed: not to be watched
	queued  bool      // in the driver's watch queue
	due     time.Time // when its node is to be watched (see watchHeld)
}

func hashOf(name string) string {
	_, h, _, _ := parseTagged(name)
	return h
}

// parseTagged splits a queue node's name, "<tag>-<hash>-<seq>" (tags: "lk"
// and, in shared.go, the others); false for other nodes.
func parseTagged(name string) (tag, hash string, seq int64, ok bool) {
	i := strings.IndexByte(name, '-')
	if i < 1 || len(name) <= i+hashLen+2 || name[i+hashLen+1] != '-' {
		return "", "", 0, false
	}
	seq, err := strconv.ParseInt(name[i+hashLen+2:], 10, 64)
	if err != nil {
		return "", "", 0, false
	}
	return name[:i], name[i+1 : i+hashLen+1], seq, true
}

// tokenNodes are the nodes among names with tag head and token hash hash,
// first first.
func tokenNodes(names []string, head, hash string) []snode {
	var mine []snode
	for _, n := range names {
		if tag, h, seq, ok := parseTagged(n); ok && h == hash && tag+"-" == head {
			mine = append(mine, snode{n, tag, seq})
		}
	}
	slices.SortFunc(mine, func(a, b snode) int { return cmp.Compare(a.seq, b.seq) })
	return mine
}

// lookup lists l.Key's queue for l.Token's node: its path, its marker's
// ("" if none), and whether it is first (shared: holds).
func (d *Driver) lookup(ctx context.Context, l backend.Claim) (path, marker string, first bool, err error) {
	if l.Mode != backend.Exclusive {
		if err := checkShared(l); err != nil {
			return "", "", false, err
		}
		parent := d.queueParent(l)
		lk, err := d.sharedListing(ctx, parent, l.Mode, nil, false)
		if err != nil {
			return "", "", false, err
		}
		mine := tokenNodes(lk.names, queueHead(l), tokenHash(l.Token))
		if len(mine) == 0 {
			return "", "", false, nil
		}
		e := &entry{parent: parent, name: mine[0].name, seq: mine[0].seq}
		st, _ := standingIn(lk.names, lk.r, e, l)
		return e.path(), "", st.held && st.mismatch == nil, nil
	}
	parent := d.parentPath(l.Key)
	nodes, markers, err := d.listing(ctx, parent)
	if err != nil {
		return "", "", false, err
	}
	hash := tokenHash(l.Token)
	if slices.Contains(markers, markerPrefix+hash) {
		marker = parent + "/" + markerPrefix + hash
	}
	for i, n := range nodes {
		if n.tag+"-" == nodePrefix && hashOf(n.name) == hash {
			return parent + "/" + n.name, marker, i == 0, nil
		}
	}
	return "", "", false, nil
}
