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
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Usage is the URL form this package registers.
const Usage = "file:///absolute/dir  or  file:relative/dir  [?sync=false]"

func init() {
	backend.Register("file", backend.Opener{Usage: Usage, Open: Open})
}

// Open returns a driver for a file: URL (see the package documentation).
func Open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	p := backend.NewParams(u)
	sync := p.Bool("sync", true)
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	bad := func(why string) error {
		return fmt.Errorf("filelock: %w: %s (want file:///absolute/dir or file:relative/dir)", backend.ErrInvalidURL, why)
	}
	if u.User != nil {
		return nil, bad("no user or password")
	}
	if u.Host != "" && u.Host != "localhost" {
		return nil, bad("the store is local: no host (three slashes: file:///dir)")
	}
	dir := u.Path
	if u.Opaque != "" {
		d, err := url.PathUnescape(u.Opaque)
		if err != nil {
			return nil, bad("malformed path")
		}
		dir = d
	}
	if dir == "" {
		return nil, bad("no directory")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("filelock: open: %w", err)
	}
	return New(dir, WithSync(sync))
}

// Option configures a Driver made with New.
type Option func(*Driver)

// WithSync turns the fsync after each acquisition on (the default) or off.
func WithSync(on bool) Option { return func(d *Driver) { d.sync = on } }

// DefaultDir is the directory lockctl uses when no backend is configured:
// "lockctl" in the user's cache directory, or in the temporary directory
// when there is no cache directory.
func DefaultDir() string {
	base, err := os.UserCacheDir()
	if err != nil || base == "" {
		base = os.TempDir()
	}
	return filepath.Join(base, "lockctl")
}

// Driver stores locks as files in one directory.
type Driver struct {
	dir    string
	sync   bool
	clk    clock
	closed atomic.Bool
}

var (
	_ backend.Driver         = (*Driver)(nil)
	_ backend.BatchRefresher = (*Driver)(nil)
)

// New returns a driver on dir (made absolute, and created with mode 0700
// when missing).
func New(dir string, opts ...Option) (*Driver, error) {
	if err := supported(); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("filelock: directory %q: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	if fi, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("filelock: %s is not a directory", abs)
	}
	clk, err := systemClock()
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	d := &Driver{dir: abs, sync: true, clk: clk}
	for _, o := range opts {
		o(d)
	}
	return d, nil
}

// Dir returns the driver's directory.
func (d *Driver) Dir() string { return d.dir }

// maxBase bounds the escaped key in a file name, under the 255-byte limit
// of file names with room for the suffix.
const maxBase = 200

// Path returns the state file of key.
func (d *Driver) Path(key string) string {
	return filepath.Join(d.dir, backend.ShortKey(key, maxBase)+".lock")
}

// The state file holds two records of recSize bytes. Layout of one record,
// little-endian:
//
//	0   magic "LKF1"
//	4   CRC-32 (IEEE) of bytes 8..recSize
//	8   sequence number, raised by every write
//	16  fence
//	24  expiry: clock nanoseconds; 0 when released
//	32  boot ID the expiry refers to (zero with the wall clock)
//	48  holder's process ID (informational)
//	52  SHA-256 of the holder's token (zero when free)
//	84  owner length, then the owner (truncated to 64 bytes; informational)
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
)

var magic = [4]byte{'L', 'K', 'F', '1'}

type record struct {
	seq     uint64
	fence   uint64
	expires int64
	boot    [16]byte
	pid     uint32
	token   [32]byte
	owner   string
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
	owner := r.owner
	if len(owner) > maxOwner {
		owner = owner[:maxOwner]
	}
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

func (d *Driver) check(ctx context.Context) error {
	if d.closed.Load() {
		return fmt.Errorf("filelock: %w", backend.ErrClosed)
	}
	return ctx.Err()
}

var errNoFile = errors.New("no state file")

// update runs fn on key's current record under the file's flock, and writes
// the record back if fn says so. Without create, a missing file is errNoFile.
func (d *Driver) update(ctx context.Context, key string, create, durable bool, fn func(r *record, now int64) (bool, error)) error {
	if err := d.check(ctx); err != nil {
		return err
	}
	path := d.Path(key)
	f, created, err := openState(path, create)
	if err != nil {
		return err
	}
	defer f.Close() // also drops the flock
	if err := flockCtx(ctx, f); err != nil {
		return fmt.Errorf("filelock: lock %s: %w", path, err)
	}
	var buf [2 * recSize]byte
	n, err := f.ReadAt(buf[:], 0)
	if err != nil && err != io.EOF {
		return fmt.Errorf("filelock: read %s: %w", path, err)
	}
	cur, ok := record{}, false
	for i := range 2 {
		if r, valid := decode(buf[i*recSize : (i+1)*recSize]); valid && (!ok || r.seq > cur.seq) {
			cur, ok = r, true
		}
	}
	if !ok && n > 0 {
		return fmt.Errorf("filelock: %s holds no valid state (it was not written by this package, or both records are damaged); remove it once no process uses it", path)
	}
	write, err := fn(&cur, d.clk.now())
	if err != nil || !write {
		return err
	}
	cur.seq++
	if _, err := f.WriteAt(cur.encode(), int64(cur.seq%2)*recSize); err != nil {
		return fmt.Errorf("filelock: write %s: %w", path, err)
	}
	if durable && d.sync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("filelock: sync %s: %w", path, err)
		}
		if created {
			if err := syncDir(d.dir); err != nil {
				return fmt.Errorf("filelock: sync %s: %w", d.dir, err)
			}
		}
	}
	return nil
}

func openState(path string, create bool) (f *os.File, created bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR, 0)
	if err == nil || !errors.Is(err, fs.ErrNotExist) || !create {
		if errors.Is(err, fs.ErrNotExist) {
			err = errNoFile
		} else if err != nil {
			err = fmt.Errorf("filelock: %w", err)
		}
		return f, false, err
	}
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		f, err = os.OpenFile(path, os.O_RDWR, 0)
		created = false
	} else {
		created = err == nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("filelock: %w", err)
	}
	return f, created, nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// TryAcquire implements backend.Driver. A retry by the token that holds the
// lock succeeds again, with the same fence and a renewed TTL.
func (d *Driver) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	tok := hashToken(l.Token)
	var g backend.Grant
	err := d.update(ctx, l.Key, true, true, func(r *record, now int64) (bool, error) {
		if d.live(r, now) && r.token != tok {
			return false, fmt.Errorf("filelock: %w", backend.ErrNotAcquired)
		}
		if !d.live(r, now) {
			r.fence++
		}
		r.expires = now + int64(l.TTL)
		r.boot = d.clk.boot
		r.token = tok
		r.pid = uint32(os.Getpid())
		r.owner = l.Owner
		g = backend.Grant{Fence: r.fence, TTL: l.TTL}
		return true, nil
	})
	if err != nil {
		if !errors.Is(err, backend.ErrNotAcquired) && g.Fence != 0 {
			// The state was written but could not be made durable: leave
			// nothing behind that keeps the key held.
			_ = d.Release(context.WithoutCancel(ctx), l)
		}
		return backend.Grant{}, err
	}
	return g, nil
}

// Refresh implements backend.Driver.
func (d *Driver) Refresh(ctx context.Context, l backend.Claim) error {
	err := d.update(ctx, l.Key, false, false, d.holds(l, func(r *record, now int64) {
		r.expires = now + int64(l.TTL)
	}))
	if errors.Is(err, errNoFile) {
		return fmt.Errorf("filelock: refresh: %w", backend.ErrNotHeld)
	}
	return err
}

// RefreshMany implements backend.BatchRefresher: the locks are refreshed one
// after the other, in the calling goroutine.
func (d *Driver) RefreshMany(ctx context.Context, locks []backend.Claim) []error {
	errs := make([]error, len(locks))
	for i, l := range locks {
		errs[i] = d.Refresh(ctx, l)
	}
	return errs
}

// Release implements backend.Driver. The state file stays, marked free, so
// that the key's fence keeps counting.
func (d *Driver) Release(ctx context.Context, l backend.Claim) error {
	err := d.update(ctx, l.Key, false, false, d.holds(l, func(r *record, now int64) {
		r.expires = 0
		r.token = [32]byte{}
		r.pid = 0
		r.owner = ""
	}))
	if errors.Is(err, errNoFile) {
		return fmt.Errorf("filelock: release: %w", backend.ErrNotHeld)
	}
	return err
}

// holds wraps change so that it runs only when l's token holds the lock.
func (d *Driver) holds(l backend.Claim, change func(r *record, now int64)) func(*record, int64) (bool, error) {
	tok := hashToken(l.Token)
	return func(r *record, now int64) (bool, error) {
		if !d.live(r, now) || r.token != tok {
			return false, fmt.Errorf("filelock: %w", backend.ErrNotHeld)
		}
		change(r, now)
		return true, nil
	}
}

// expire makes the lock on key expired, as if its TTL had run out.
func (d *Driver) expire(ctx context.Context, key string) error {
	err := d.update(ctx, key, false, false, func(r *record, now int64) (bool, error) {
		if !d.live(r, now) {
			return false, nil
		}
		r.expires = now - 1
		if r.expires == 0 {
			r.expires = -1
		}
		return true, nil
	})
	if errors.Is(err, errNoFile) {
		return nil
	}
	return err
}

// Holder describes the state of one lock file, for operators.
type Holder struct {
	Held  bool          // a live lock
	Fence uint64        // the last fence granted
	PID   int           // the process that acquired it, when held
	Owner string        // the owner it was acquired for, when held
	Left  time.Duration // time until it expires, when held
}

// Inspect reads the state of the lock on key without changing it.
func (d *Driver) Inspect(ctx context.Context, key string) (Holder, error) {
	var h Holder
	err := d.update(ctx, key, false, false, func(r *record, now int64) (bool, error) {
		h.Fence = r.fence
		if d.live(r, now) {
			h = Holder{Held: true, Fence: r.fence, PID: int(r.pid), Owner: r.owner, Left: time.Duration(r.expires - now)}
		}
		return false, nil
	})
	if errors.Is(err, errNoFile) {
		return Holder{}, nil
	}
	return h, err
}

// Close implements backend.Driver. The driver keeps no open files and runs
// no goroutines between calls.
func (d *Driver) Close() error {
	d.closed.Store(true)
	return nil
}
