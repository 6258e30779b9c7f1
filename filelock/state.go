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
)

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
