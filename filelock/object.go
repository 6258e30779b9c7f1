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

// objectPath returns the file of the object c's mode belongs to.
func (d *Driver) objectPath(key string, m backend.Mode) string {
	suffix := semSuffix
	if m != backend.Permit {
		suffix = rwSuffix
	}
	return filepath.Join(d.dir, backend.ShortKey(key, maxBase)+suffix)
}

// An object file is one header and its holders, little-endian, written in
// one write at offset 0:
//
//	0   magic "LKO1"
//	4   CRC-32 (IEEE) of bytes 8 to the content's end
//	8   boot ID the expiries refer to (zero with the wall clock)
//	24  content length, header included
//	28  limit (semaphore)
//	32  waiting writer's record expiry; 0 when none
//	40  waiting writer's token, SHA-256
//	72  number of holders
//	76  the holders: token SHA-256, fence, expiry, PID, mode, owner length,
//	    owner (at most 64 bytes)
//
// A write torn by a power cut keeps its first sector (the boot ID never
// changes within a boot): a damaged file of an earlier boot counts as
// empty, since its holders died with the boot. A damaged file of this
// boot (a full disk) fails closed, naming the file.
const (
	objHeader  = 76
	objEntry   = 32 + 8 + 8 + 4 + 1 + 1
	objMaxSize = objHeader + backend.MaxLimit*(objEntry+maxOwner)
)

var objMagic = [4]byte{'L', 'K', 'O', '1'}

type holder struct {
	token   [32]byte
	fence   uint64
	expires int64
	pid     uint32
	mode    backend.Mode
	owner   string
}

// object is the state of a semaphore or a read-write lock.
type object struct {
	limit   int
	holders []holder
	waitTok [32]byte // the waiting writer, valid while waitExp is live
	waitExp int64
}

func (o *object) find(tok [32]byte) int {
	for i := range o.holders {
		if o.holders[i].token == tok {
			return i
		}
	}
	return -1
}

func (o *object) drop(i int) {
	o.holders = append(o.holders[:i], o.holders[i+1:]...)
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

func (o *object) empty() bool { return len(o.holders) == 0 && o.waitExp == 0 }

func (d *Driver) encodeObject(o *object) []byte {
	n := objHeader
	for _, h := range o.holders {
		n += objEntry + min(len(h.owner), maxOwner)
	}
	b := make([]byte, n)
	copy(b, objMagic[:])
	copy(b[8:], d.clk.boot[:])
	le := binary.LittleEndian
	le.PutUint32(b[24:], uint32(n))
	le.PutUint32(b[28:], uint32(o.limit))
	le.PutUint64(b[32:], uint64(o.waitExp))
	copy(b[40:], o.waitTok[:])
	le.PutUint32(b[72:], uint32(len(o.holders)))
	p := b[objHeader:]
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
	le.PutUint32(b[4:], crc32.ChecksumIEEE(b[8:]))
	return b
}

// decodeObject reads an object file's content; an object of another boot
// is empty.
func (d *Driver) decodeObject(b []byte, path string) (object, error) {
	le := binary.LittleEndian
	damaged := fmt.Errorf("filelock: %s holds no valid state (it was not written by this package, or a write failed); remove it once no process uses it", path)
	if len(b) < 24 || [4]byte(b[:4]) != objMagic {
		return object{}, damaged
	}
	if [16]byte(b[8:24]) != d.clk.boot {
		return object{}, nil // written in an earlier boot: every holder is gone
	}
	if len(b) < objHeader {
		return object{}, damaged
	}
	n := int(le.Uint32(b[24:]))
	if n < objHeader || n > len(b) || le.Uint32(b[4:]) != crc32.ChecksumIEEE(b[8:n]) {
		return object{}, damaged
	}
	o := object{
		limit:   int(le.Uint32(b[28:])),
		waitExp: int64(le.Uint64(b[32:])),
		waitTok: [32]byte(b[40:72]),
	}
	count := int(le.Uint32(b[72:]))
	p := b[objHeader:n]
	for range count {
		if len(p) < objEntry || len(p) < objEntry+int(p[53]) {
			return object{}, damaged
		}
		h := holder{
			token:   [32]byte(p[:32]),
			fence:   le.Uint64(p[32:]),
			expires: int64(le.Uint64(p[40:])),
			pid:     le.Uint32(p[48:]),
			mode:    backend.Mode(p[52]),
			owner:   string(p[objEntry : objEntry+int(p[53])]),
		}
		o.holders = append(o.holders, h)
		p = p[objEntry+int(p[53]):]
	}
	return o, nil
}

// updateObject runs fn on the object of c's key and mode, under its file's
// flock, with expired entries pruned, and then writes the object back,
// or removes the file when it is left empty (as a lock's release does, so
// that waiters on the removed inode open the path again). fn reports
// whether it changed the object. Without create, a missing file is
// errNoFile.
func (d *Driver) updateObject(ctx context.Context, c backend.Claim, create bool, fn func(o *object, now int64) (bool, error)) error {
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	if err := ctx.Err(); err != nil {
		return err
	}
	path := d.objectPath(c.Key, c.Mode)
	f, err := openLocked(ctx, path, create)
	if err != nil {
		return err
	}
	defer f.Close() // also drops the flock
	b, err := io.ReadAll(io.LimitReader(f, objMaxSize+1))
	if err != nil {
		return fmt.Errorf("filelock: read %s: %w", path, err)
	}
	var o object
	if len(b) > 0 {
		if o, err = d.decodeObject(b, path); err != nil {
			return err
		}
	}
	now := d.clk.now()
	before, waited := len(o.holders), o.waitExp
	o.prune(now)
	changed, err := fn(&o, now)
	changed = changed || len(o.holders) != before || o.waitExp != waited
	if o.empty() {
		// Under the flock, as a lock's release: nothing is left.
		if rerr := os.Remove(path); rerr != nil && err == nil {
			return fmt.Errorf("filelock: %w", rerr)
		}
		return err
	}
	if changed {
		nb := d.encodeObject(&o)
		if _, werr := f.WriteAt(nb, 0); werr != nil {
			return errors.Join(err, fmt.Errorf("filelock: write %s: %w", path, werr))
		}
		if len(nb) < len(b) {
			// The length in the header already ignores the tail.
			_ = f.Truncate(int64(len(nb)))
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
		o.holders = append(o.holders, holder{token: tok, fence: fence, expires: now + int64(c.TTL), pid: uint32(os.Getpid()), mode: c.Mode, owner: c.Owner})
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
	err := d.updateObject(ctx, c, false, func(o *object, now int64) (bool, error) {
		i := o.find(tok)
		if i < 0 || o.holders[i].mode != c.Mode {
			return false, fmt.Errorf("filelock: %w", backend.ErrNotHeld)
		}
		o.holders[i].expires = now + int64(c.TTL)
		return true, nil
	})
	if errors.Is(err, errNoFile) {
		return fmt.Errorf("filelock: %w", backend.ErrNotHeld)
	}
	return err
}

// releaseObject frees c's hold, or withdraws its waiting writer's record
// (and still reports ErrNotHeld).
func (d *Driver) releaseObject(ctx context.Context, c backend.Claim) error {
	tok := hashToken(c.Token)
	err := d.updateObject(ctx, c, false, func(o *object, now int64) (bool, error) {
		changed := false
		if c.Mode == backend.Write && o.waitExp != 0 && o.waitTok == tok {
			o.waitExp, o.waitTok = 0, [32]byte{}
			changed = true
		}
		i := o.find(tok)
		if i < 0 || o.holders[i].mode != c.Mode {
			return changed, fmt.Errorf("filelock: %w", backend.ErrNotHeld)
		}
		o.drop(i)
		return true, nil
	})
	if errors.Is(err, errNoFile) {
		return fmt.Errorf("filelock: %w", backend.ErrNotHeld)
	}
	return err
}

// expireObjects makes every holder of key's objects expired, for the tests.
func (d *Driver) expireObjects(ctx context.Context, key string) error {
	for _, m := range []backend.Mode{backend.Permit, backend.Read} {
		err := d.updateObject(ctx, backend.Claim{Key: key, Mode: m}, false, func(o *object, now int64) (bool, error) {
			for i := range o.holders {
				o.holders[i].expires = now
			}
			if o.waitExp != 0 {
				o.waitExp = now
			}
			return true, nil
		})
		if err != nil && !errors.Is(err, errNoFile) {
			return err
		}
	}
	return nil
}
