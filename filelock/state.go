package filelock

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/lockerhq/locker/backend"
)

// The state file holds two records of recSize bytes, then the key; the
// byte layout is in docs/backends/filelock.md (File formats).
const (
	recSize  = 256
	offSeq   = 8
	offFence = 16
	offExp   = 24
	offBoot  = 32
	offPID   = 48
	offTok   = 52
	offOwner = 84
	maxOwner = 64
	offCeil  = 152
	offQHead = 160
	offQTail = 168
	offResv  = 176
)

var magic = [4]byte{'L', 'K', 'F', '1'}

// The key follows the records: a shortened file name cannot give it back,
// and List must report it. It is written with the file's first record.
const (
	offKey    = 2 * recSize
	keyHeader = 10
	fileMax   = offKey + keyHeader + backend.MaxKeyLen
)

var keyMagic = [4]byte{'L', 'K', 'K', '1'}

func encodeKey(key string) []byte {
	b := make([]byte, keyHeader+len(key))
	copy(b, keyMagic[:])
	binary.LittleEndian.PutUint16(b[8:], uint16(len(key)))
	copy(b[keyHeader:], key)
	binary.LittleEndian.PutUint32(b[4:], crc32.ChecksumIEEE(b[8:]))
	return b
}

// decodeKey returns the key recorded in b (the file from offKey on).
func decodeKey(b []byte) (string, bool) {
	if len(b) < keyHeader || [4]byte(b[:4]) != keyMagic {
		return "", false
	}
	n := int(binary.LittleEndian.Uint16(b[8:]))
	if n > backend.MaxKeyLen || len(b) < keyHeader+n || binary.LittleEndian.Uint32(b[4:]) != crc32.ChecksumIEEE(b[8:keyHeader+n]) {
		return "", false
	}
	return string(b[keyHeader : keyHeader+n]), true
}

type record struct {
	seq     uint64
	fence   uint64
	expires int64
	boot    [16]byte
	pid     uint32
	token   [32]byte
	owner   string
	ceiling uint64
	qhead   uint64 // first queued ticket
	qtail   uint64 // next ticket to give
	resvExp int64  // the lock is kept for ticket qhead until then; 0: not kept
}

func (r *record) encode() []byte {
	b := make([]byte, recSize)
	copy(b, magic[:])
	binary.LittleEndian.PutUint64(b[offSeq:], r.seq)
	binary.LittleEndian.PutUint64(b[offFence:], r.fence)
	binary.LittleEndian.PutUint64(b[offExp:], uint64(r.expires))
	copy(b[offBoot:], r.boot[:])
	binary.LittleEndian.PutUint32(b[offPID:], r.pid)
	copy(b[offTok:], r.token[:])
	owner := r.owner[:min(len(r.owner), maxOwner)]
	binary.LittleEndian.PutUint64(b[offCeil:], r.ceiling)
	binary.LittleEndian.PutUint64(b[offQHead:], r.qhead)
	binary.LittleEndian.PutUint64(b[offQTail:], r.qtail)
	binary.LittleEndian.PutUint64(b[offResv:], uint64(r.resvExp))
	b[offOwner] = byte(len(owner))
	copy(b[offOwner+1:], owner)
	binary.LittleEndian.PutUint32(b[4:], crc32.ChecksumIEEE(b[8:]))
	return b
}

func decode(b []byte) (record, bool) {
	if len(b) < recSize || [4]byte(b[:4]) != magic || binary.LittleEndian.Uint32(b[4:]) != crc32.ChecksumIEEE(b[8:recSize]) {
		return record{}, false
	}
	r := record{
		seq:     binary.LittleEndian.Uint64(b[offSeq:]),
		fence:   binary.LittleEndian.Uint64(b[offFence:]),
		expires: int64(binary.LittleEndian.Uint64(b[offExp:])),
		boot:    [16]byte(b[offBoot:]),
		pid:     binary.LittleEndian.Uint32(b[offPID:]),
		token:   [32]byte(b[offTok:]),
		ceiling: binary.LittleEndian.Uint64(b[offCeil:]),
		qhead:   binary.LittleEndian.Uint64(b[offQHead:]),
		qtail:   binary.LittleEndian.Uint64(b[offQTail:]),
		resvExp: int64(binary.LittleEndian.Uint64(b[offResv:])),
	}
	n := min(int(b[offOwner]), maxOwner)
	r.owner = string(b[offOwner+1 : offOwner+1+n])
	return r, true
}

// live reports whether the record shows a lock that has not expired at now.
func (d *Driver) live(r *record, now int64) bool {
	return r.expires != 0 && r.boot == d.clk.boot && now < r.expires
}

func hashToken(tok string) [32]byte { return sha256.Sum256([]byte(tok)) }

// errNoFile is a missing state file: the key (or object) is not held.
var errNoFile = fmt.Errorf("filelock: %w", backend.ErrNotHeld)

// change is what an operation does to a state file once it decided.
type change int

const (
	keep   change = iota // leave the file as it is
	write                // write the new record
	remove               // delete the file: the name keeps nothing
)

// update runs fn on key's current record under the file's flock, and
// writes the record back or removes the file as fn says, then returns fn's
// error (a refusal may come with a write: a queue's cleanup). Without
// create, a missing file is errNoFile.
func (d *Driver) update(ctx context.Context, key string, create bool, fn func(r *record, now int64) (change, error)) error {
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	return d.locked(ctx, key, create, fn)
}

// locked is update without the gate: a cancelled waiter leaves its queue
// with it while the driver closes.
func (d *Driver) locked(ctx context.Context, key string, create bool, fn func(r *record, now int64) (change, error)) error {
	path := d.Path(key)
	f, err := openLocked(ctx, path, create)
	if err != nil {
		return err
	}
	defer f.Close() // also drops the flock
	cur, stored, empty, err := readFile(f.File, path)
	if err != nil {
		return err
	}
	what, err := fn(&cur, d.clk.now())
	if empty && what != write {
		// We made the file and then did not take the lock: leave nothing.
		what = remove
	}
	switch what {
	case remove:
		// Under the flock: whoever opened this file and waits for its
		// flock finds it unlinked (openLocked) and opens the path again.
		if rerr := os.Remove(path); rerr != nil && err == nil {
			return fmt.Errorf("filelock: %w", rerr)
		}
	case write:
		if stored != key {
			if _, werr := f.WriteAt(encodeKey(key), offKey); werr != nil {
				return fmt.Errorf("filelock: write %s: %w", path, werr)
			}
		}
		if werr := writeRecord(f.File, path, &cur, false); werr != nil {
			return werr
		}
	}
	return err
}

// openLocked opens path (creating it if create) and takes its flock. A
// release may have removed the file after we opened it and before we got
// the flock: then the descriptor is no longer the path's file, and we open
// the path again. Closing the file drops the flock, and then the process's
// turn on it (see turns).
func openLocked(ctx context.Context, path string, create bool) (*lockedFile, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	done, err := turns.take(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("filelock: lock %s: %w", path, err)
	}
	for {
		f, err := openState(path, create)
		if err != nil {
			done()
			return nil, err
		}
		if err := flockCtx(ctx, f); err != nil {
			f.Close()
			done()
			return nil, fmt.Errorf("filelock: lock %s: %w", path, err)
		}
		same, err := isPath(f, path)
		if err != nil {
			f.Close()
			done()
			return nil, err
		}
		if same {
			return &lockedFile{File: f, done: done}, nil
		}
		f.Close()
		// Each turn means another release went by; ctx bounds them.
		if err := ctx.Err(); err != nil {
			done()
			return nil, err
		}
	}
}

// lockedFile is a file that openLocked flocked.
type lockedFile struct {
	*os.File
	done func()
}

// Close closes the file, which drops its flock, and ends the process's
// turn on it.
func (f *lockedFile) Close() error {
	err := f.File.Close()
	if f.done != nil {
		f.done()
		f.done = nil // a second Close must not end another's turn
	}
	return err
}

// turns orders the goroutines of this process that want the same file's
// flock: they wait for a wake-up instead of polling the flock (flockCtx),
// which costs CPU (see Turns in docs/backends/filelock.md). Flocks and
// turns are taken in one order (a name's file, the counter, the ceiling).
var turns turnTable

type turnTable struct {
	mu sync.Mutex
	m  map[string]*turn
}

type turn struct {
	held    bool
	waiters []chan struct{} // woken one at a time, first first
	refs    int             // goroutines that have it or want it
}

// take waits for the turn on path, or for ctx to end; done ends it. A
// goroutine that comes while the turn is free takes it, even before a
// woken waiter does (which then waits again, first in line): handing it on
// in order would make every turn wait for a goroutine to be scheduled.
func (tt *turnTable) take(ctx context.Context, path string) (done func(), err error) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if tt.m == nil {
		tt.m = map[string]*turn{}
	}
	t := tt.m[path]
	if t == nil {
		t = &turn{}
		tt.m[path] = t
	}
	t.refs++
	var ch chan struct{}
	for t.held {
		if ch == nil {
			ch = make(chan struct{}, 1)
			t.waiters = append(t.waiters, ch)
		} else {
			t.waiters = append([]chan struct{}{ch}, t.waiters...)
		}
		tt.mu.Unlock()
		select {
		case <-ch:
			tt.mu.Lock()
		case <-ctx.Done():
			tt.mu.Lock()
			if i := slices.Index(t.waiters, ch); i >= 0 {
				t.waiters = slices.Delete(t.waiters, i, i+1)
			} else if !t.held {
				tt.wakeNext(t) // woken meanwhile: the wake-up goes on
			}
			tt.drop(path, t)
			return nil, ctx.Err()
		}
	}
	t.held = true
	return func() {
		tt.mu.Lock()
		defer tt.mu.Unlock()
		t.held = false
		tt.wakeNext(t)
		tt.drop(path, t)
	}, nil
}

// wakeNext wakes t's first waiter, if any; tt.mu is held.
func (tt *turnTable) wakeNext(t *turn) {
	if len(t.waiters) > 0 {
		t.waiters[0] <- struct{}{}
		t.waiters = t.waiters[1:]
	}
}

// drop ends a goroutine's interest in t; tt.mu is held.
func (tt *turnTable) drop(path string, t *turn) {
	if t.refs--; t.refs == 0 {
		delete(tt.m, path)
	}
}

// isPath reports whether f is still the file at path (same device and
// inode), and not one that was unlinked or replaced.
func isPath(f *os.File, path string) (bool, error) {
	open, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("filelock: %w", err)
	}
	now, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("filelock: %w", err)
	}
	return os.SameFile(open, now), nil
}

// readFile reads the newer valid record of a state file, and the key a
// lock file records ("" when it has none); the zero record, and empty, for
// an empty file; the zero record with an error.
func readFile(f *os.File, path string) (_ record, key string, empty bool, _ error) {
	var buf [fileMax]byte
	n, err := f.ReadAt(buf[:], 0)
	if err != nil && err != io.EOF {
		return record{}, "", false, fmt.Errorf("filelock: read %s: %w", path, err)
	}
	cur, ok := record{}, false
	for i := range 2 {
		if r, valid := decode(buf[i*recSize : (i+1)*recSize]); valid && (!ok || r.seq > cur.seq) {
			cur, ok = r, true
		}
	}
	if !ok && n > 0 {
		return record{}, "", false, fmt.Errorf("filelock: %s holds no valid state (it was not written by this package, or both records are damaged); remove it once no process uses it", path)
	}
	if n > offKey {
		key, _ = decodeKey(buf[offKey:n])
	}
	return cur, key, n == 0, nil
}

// writeRecord writes r over the older of the file's two records, and
// fsyncs the file if sync.
func writeRecord(f *os.File, path string, r *record, sync bool) error {
	r.seq++
	if _, err := f.WriteAt(r.encode(), int64(r.seq%2)*recSize); err != nil {
		return fmt.Errorf("filelock: write %s: %w", path, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("filelock: sync %s: %w", path, err)
		}
	}
	return nil
}

// The directory's fence counter: fence.counter holds the last fence
// given, unsynced; fence.ceiling, fsynced, a bound no fence given exceeds
// (docs/backends/filelock.md, Durability). Lock files end in ".lock": no
// key's file can have these names.
const (
	counterName = "fence.counter"
	ceilingName = "fence.ceiling"
	ceilingStep = 1 << 12
)

// nextFence raises the directory's fence counter to above both its value
// and floor, and returns the new value; with sync, once it can survive a
// power cut. The caller holds the flock of the name's file; the counter's
// flock is always taken after it, and the ceiling's only under the
// counter's, so no two operations wait for each other.
func (d *Driver) nextFence(ctx context.Context, floor uint64) (uint64, error) {
	path := filepath.Join(d.dir, counterName)
	f, err := openLocked(ctx, path, true)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// Without a boot ID (off Linux) a lost write cannot be told from an
	// old one: every new fence is fsynced in the counter itself.
	ceilings := d.sync && d.clk.boot != [16]byte{}
	// Damaged, r is the zero record: as if lost, the ceiling bounds it.
	r, _, _, err := readFile(f.File, path)
	if err != nil && !ceilings {
		return 0, err
	}
	if ceilings && r.boot != d.clk.boot {
		// Written in another boot, or never: its last writes may be lost.
		c, err := d.ceiling(ctx, 0)
		if err != nil {
			return 0, err
		}
		r.fence, r.ceiling = max(r.fence, c), c
	}
	r.fence = max(r.fence, floor) + 1
	r.boot = d.clk.boot
	if ceilings && r.fence > r.ceiling {
		c := r.fence + ceilingStep
		if _, err := d.ceiling(ctx, c); err != nil {
			return 0, err
		}
		r.ceiling = c
	}
	if err := writeRecord(f.File, path, &r, d.sync && !ceilings); err != nil {
		return 0, err
	}
	return r.fence, nil
}

// ceiling returns the value in fence.ceiling, zero when it has none; with
// raise above zero, it first raises it to at least raise and fsyncs it.
func (d *Driver) ceiling(ctx context.Context, raise uint64) (uint64, error) {
	path := filepath.Join(d.dir, ceilingName)
	f, err := openLocked(ctx, path, true)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	r, _, _, err := readFile(f.File, path)
	if err != nil || raise == 0 {
		return r.fence, err
	}
	r.fence = max(r.fence, raise)
	if err := writeRecord(f.File, path, &r, true); err != nil {
		return 0, err
	}
	return r.fence, nil
}

// makeCounter creates the directory's fence counter files if they are
// missing, and makes their names durable, so that nextFence only ever
// writes them.
func makeCounter(dir string, sync bool) error {
	made := false
	for _, name := range []string{counterName, ceilingName} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("filelock: %w", err)
		}
		f.Close()
		made = true
	}
	if made && sync {
		return syncDir(dir)
	}
	return nil
}

func openState(path string, create bool) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if create && errors.Is(err, fs.ErrNotExist) {
		// Only now with O_CREAT, which takes the directory's lock, that
		// every open, create and unlink in it then waits for.
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist) && !create:
		return nil, errNoFile
	case err != nil:
		return nil, fmt.Errorf("filelock: %w", err)
	}
	return f, nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	if err != nil {
		return fmt.Errorf("filelock: sync %s: %w", dir, err)
	}
	return nil
}
