package filelock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lockerhq/locker/backend"
)

// A semaphore or a read-write lock is an object file beside the key's lock
// file: the escaped key plus "%.sem" or "%.rw". EscapeKey and ShortKey never
// put a '%' before anything but two hex digits, so no key's lock file or
// object file of the other kind has these names, and List (which reads
// "*.lock") never sees them.
const (
	semSuffix = "%.sem"
	rwSuffix  = "%.rw"
)

// objectPath returns the file of key's object of mode m: its lock's, its
// semaphore's or its read-write lock's.
func (d *Driver) objectPath(key string, m backend.Mode) string {
	return filepath.Join(d.dir, backend.ShortKey(key, maxBase)+suffixOf(m))
}

// suffixOf is what the file of an object of mode m adds to the escaped key.
func suffixOf(m backend.Mode) string {
	switch m {
	case backend.Exclusive:
		return ".lock"
	case backend.Permit:
		return semSuffix
	}
	return rwSuffix
}

// An object file is a header at offset 0 that points to the current body
// (layout in docs/backends/filelock.md, File formats). A write puts the new
// body where it overlaps the current one nowhere, then the header (one
// small write), so that an operation killed mid-write, or a full disk,
// leaves the previous state whole; the boot ID in the header tells an
// earlier boot's file, which counts as empty.
const (
	objHeader  = 40
	objBodyHdr = 48
	objEntry   = 32 + 8 + 8 + 4 + 1 + 1
	objMaxBody = objBodyHdr + backend.MaxLimit*(objEntry+maxOwner+2) + keyHeader + backend.MaxKeyLen
)

var objMagic = [4]byte{'L', 'K', 'O', '1'}

// extent is where a file's current body lies.
type extent struct{ off, n int64 }

type holder struct {
	token   [32]byte
	fence   uint64
	expires int64
	pid     uint32
	mode    backend.Mode
	owner   string
	weight  int // the permits a semaphore's holder takes; 1 otherwise
}

// object is the state of a semaphore or a read-write lock.
type object struct {
	limit   int
	holders []holder
	waitTok [32]byte // the waiting writer, valid while waitExp is live
	waitExp int64
	// key is recorded only where the file name is shortened (a hash),
	// which List cannot turn back into the key.
	key string
}

func (o *object) find(tok [32]byte) int {
	return slices.IndexFunc(o.holders, func(h holder) bool { return h.token == tok })
}

// prune drops expired holders and an expired waiting record.
func (o *object) prune(now int64) {
	live := o.holders[:0]
	for _, h := range o.holders {
		if now < h.expires {
			live = append(live, h)
		}
	}
	o.holders = live
	if o.waitExp != 0 && now >= o.waitExp {
		o.waitExp, o.waitTok = 0, [32]byte{}
	}
}

// weighted reports whether o's body has the holders' weights after them:
// only when one takes more than one permit (an older reader, which stops
// after the holders, counts each as one), or the key follows them.
func (o *object) weighted() bool {
	return o.key != "" || slices.ContainsFunc(o.holders, func(h holder) bool { return h.weight > 1 })
}

func encodeBody(o *object) []byte {
	n := objBodyHdr
	for _, h := range o.holders {
		n += objEntry + min(len(h.owner), maxOwner)
	}
	weighted := o.weighted()
	if weighted {
		n += 2 * len(o.holders)
	}
	var key []byte
	if o.key != "" {
		key = encodeKey(o.key)
		n += len(key)
	}
	b := make([]byte, n)
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(o.limit))
	le.PutUint64(b[4:], uint64(o.waitExp))
	copy(b[12:], o.waitTok[:])
	le.PutUint32(b[44:], uint32(len(o.holders)))
	p := b[objBodyHdr:]
	for _, h := range o.holders {
		owner := h.owner[:min(len(h.owner), maxOwner)]
		copy(p, h.token[:])
		le.PutUint64(p[32:], h.fence)
		le.PutUint64(p[40:], uint64(h.expires))
		le.PutUint32(p[48:], h.pid)
		p[52] = byte(h.mode)
		p[53] = byte(len(owner))
		copy(p[objEntry:], owner)
		p = p[objEntry+len(owner):]
	}
	if weighted {
		for i, h := range o.holders {
			le.PutUint16(p[2*i:], uint16(h.weight))
		}
		copy(p[2*len(o.holders):], key)
	}
	return b
}

func decodeBody(b []byte) (object, bool) {
	le := binary.LittleEndian
	if len(b) < objBodyHdr {
		return object{}, false
	}
	o := object{
		limit:   int(le.Uint32(b[0:])),
		waitExp: int64(le.Uint64(b[4:])),
		waitTok: [32]byte(b[12:44]),
	}
	count := int(le.Uint32(b[44:]))
	p := b[objBodyHdr:]
	for range count {
		if len(p) < objEntry || len(p) < objEntry+int(p[53]) {
			return object{}, false
		}
		o.holders = append(o.holders, holder{
			token:   [32]byte(p[:32]),
			fence:   le.Uint64(p[32:]),
			expires: int64(le.Uint64(p[40:])),
			pid:     le.Uint32(p[48:]),
			mode:    backend.Mode(p[52]),
			owner:   string(p[objEntry : objEntry+int(p[53])]),
			weight:  1,
		})
		p = p[objEntry+int(p[53]):]
	}
	if len(p) >= 2*count {
		for i := range o.holders {
			o.holders[i].weight = max(int(le.Uint16(p[2*i:])), 1)
		}
		o.key, _ = decodeKey(p[2*count:])
	}
	return o, true
}

// readObject reads the object in f, and where its body lies; an empty
// file, or one of an earlier boot, is an empty object.
func (d *Driver) readObject(f *os.File, path string) (object, extent, error) {
	le := binary.LittleEndian
	none := extent{off: objHeader}
	var h [objHeader]byte
	n, err := f.ReadAt(h[:], 0)
	if err != nil && err != io.EOF {
		return object{}, none, fmt.Errorf("filelock: read %s: %w", path, err)
	}
	if n == 0 {
		return object{}, none, nil
	}
	damaged := fmt.Errorf("filelock: %s holds no valid state (it was not written by this package, or damaged); remove it once no process uses it", path)
	if n < 24 || [4]byte(h[:4]) != objMagic {
		return object{}, none, damaged
	}
	if [16]byte(h[8:24]) != d.clk.boot {
		return object{}, none, nil // an earlier boot's: every holder is gone
	}
	if n < objHeader || le.Uint32(h[4:]) != crc32.ChecksumIEEE(h[8:]) {
		return object{}, none, damaged
	}
	at := extent{off: int64(le.Uint64(h[24:])), n: int64(le.Uint32(h[32:]))}
	if at.off < objHeader || at.n > objMaxBody {
		return object{}, none, damaged
	}
	body := make([]byte, at.n)
	if _, err := f.ReadAt(body, at.off); err != nil {
		return object{}, none, damaged
	}
	o, ok := decodeBody(body)
	if !ok || le.Uint32(h[36:]) != crc32.ChecksumIEEE(body) {
		return object{}, none, damaged
	}
	return o, at, nil
}

// writeObject writes o's body where it overlaps cur's nowhere (before it
// when it fits there, else after it), then the header that points to it,
// then trims what lies past it.
func (d *Driver) writeObject(f *os.File, path string, o *object, cur extent) error {
	body := encodeBody(o)
	at := extent{off: objHeader, n: int64(len(body))}
	if cur.off-objHeader < at.n {
		at.off = cur.off + cur.n
	}
	if _, err := f.WriteAt(body, at.off); err != nil {
		return fmt.Errorf("filelock: write %s: %w", path, err)
	}
	var h [objHeader]byte
	le := binary.LittleEndian
	copy(h[:], objMagic[:])
	copy(h[8:], d.clk.boot[:])
	le.PutUint64(h[24:], uint64(at.off))
	le.PutUint32(h[32:], uint32(at.n))
	le.PutUint32(h[36:], crc32.ChecksumIEEE(body))
	le.PutUint32(h[4:], crc32.ChecksumIEEE(h[8:]))
	if _, err := f.WriteAt(h[:], 0); err != nil {
		return fmt.Errorf("filelock: write %s: %w", path, err)
	}
	if end := at.off + at.n; end < cur.off+cur.n {
		// The old body is no longer needed; a failed trim leaves a tail.
		_ = f.Truncate(end)
	}
	return nil
}

// updateObject is update for the object of c's key and mode, with expired
// entries pruned first; fn reports whether it changed the object, and an
// object left empty removes its file, as a lock's release does.
func (d *Driver) updateObject(ctx context.Context, c backend.Claim, create bool, fn func(o *object, now int64) (bool, error)) error {
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	return d.lockedObject(ctx, c, create, fn)
}

// lockedObject is updateObject without the gate: a waiting writer
// withdraws its record with it while the driver closes.
func (d *Driver) lockedObject(ctx context.Context, c backend.Claim, create bool, fn func(o *object, now int64) (bool, error)) error {
	path := d.objectPath(c.Key, c.Mode)
	f, err := openLocked(ctx, path, create)
	if err != nil {
		return err
	}
	defer f.Close() // also drops the flock
	o, cur, err := d.readObject(f.File, path)
	if err != nil {
		return err
	}
	if strings.ContainsRune(filepath.Base(path), '~') {
		o.key = c.Key // EscapeKey escapes '~': only a shortened name has one
	}
	now := d.clk.now()
	before, waited := len(o.holders), o.waitExp
	o.prune(now)
	changed, err := fn(&o, now)
	changed = changed || len(o.holders) != before || o.waitExp != waited
	if len(o.holders) == 0 && o.waitExp == 0 {
		// Under the flock, as a lock's release: nothing is left.
		if rerr := os.Remove(path); rerr != nil && err == nil {
			return fmt.Errorf("filelock: %w", rerr)
		}
		return err
	}
	if changed {
		if werr := d.writeObject(f.File, path, &o, cur); werr != nil {
			return errors.Join(err, werr)
		}
	}
	return err
}

// tryObject grants c the object of its mode when admit allows, and takes
// its fence from the directory's counter. A retry by a token that holds
// the object in the same mode renews it with the same fence, as a lock's.
func (d *Driver) tryObject(ctx context.Context, c backend.Claim, admit func(o *object, tok [32]byte, now int64) (bool, error)) (backend.Grant, error) {
	tok := hashToken(c.Token)
	var g backend.Grant
	err := d.updateObject(ctx, c, true, func(o *object, now int64) (bool, error) {
		if i := o.find(tok); i >= 0 {
			h := &o.holders[i]
			if h.mode != c.Mode {
				return false, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
			}
			h.expires = now + int64(c.TTL)
			g = backend.Grant{Fence: h.fence, TTL: c.TTL}
			return true, nil
		}
		ok, err := admit(o, tok, now)
		if !ok || err != nil {
			return ok, err
		}
		fence, err := d.nextFence(ctx, 0)
		if err != nil {
			return false, err
		}
		o.holders = append(o.holders, holder{token: tok, fence: fence, expires: now + int64(c.TTL), pid: uint32(os.Getpid()), mode: c.Mode, owner: c.Owner, weight: max(c.Weight, 1)})
		g = backend.Grant{Fence: fence, TTL: c.TTL}
		return true, nil
	})
	if err != nil {
		return backend.Grant{}, err
	}
	return g, nil
}

// refreshObject extends c's hold on its object.
func (d *Driver) refreshObject(ctx context.Context, c backend.Claim) error {
	tok := hashToken(c.Token)
	return d.updateObject(ctx, c, false, func(o *object, now int64) (bool, error) {
		i := o.find(tok)
		if i < 0 || o.holders[i].mode != c.Mode {
			return false, fmt.Errorf("filelock: %w", backend.ErrNotHeld)
		}
		o.holders[i].expires = now + int64(c.TTL)
		return true, nil
	})
}

// releaseObject frees c's hold, or withdraws its waiting writer's record
// (and still reports ErrNotHeld).
func (d *Driver) releaseObject(ctx context.Context, c backend.Claim) error {
	return d.updateObject(ctx, c, false, d.dropHold(c))
}

// dropHold is releaseObject's change to the object.
func (d *Driver) dropHold(c backend.Claim) func(o *object, now int64) (bool, error) {
	tok := hashToken(c.Token)
	return func(o *object, now int64) (bool, error) {
		changed := false
		if c.Mode == backend.Write && o.waitExp != 0 && o.waitTok == tok {
			o.waitExp, o.waitTok = 0, [32]byte{}
			changed = true
		}
		i := o.find(tok)
		if i < 0 || o.holders[i].mode != c.Mode {
			return changed, fmt.Errorf("filelock: %w", backend.ErrNotHeld)
		}
		o.holders = slices.Delete(o.holders, i, i+1)
		return true, nil
	}
}
