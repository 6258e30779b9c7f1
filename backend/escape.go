package backend

import (
	"crypto/sha256"
	"encoding/hex"
)

// EscapeKey encodes key as ASCII letters, digits, '.', '_', '-' and %XX for
// every other byte: valid percent-encoding anywhere in a URL, too. The result contains no '/', space, control character,
// brace or colon, is never "." or "..", and differs for different keys, so
// it is safe as a ZooKeeper node name, a memcached key, one etcd path
// segment or a Redis Cluster hash tag. It is at most 3*MaxKeyLen bytes long.
func EscapeKey(key string) string {
	var buf [128]byte // on the stack, for the keys of most names
	return string(AppendEscapedKey(buf[:0], key))
}

// AppendEscapedKey appends EscapeKey(key) to dst, for a driver that puts
// it in a longer name.
func AppendEscapedKey(dst []byte, key string) []byte {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || (c == '.' && !dotOnly(key)) {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&15])
	}
	return dst
}

// dotOnly reports whether key is "." or "..", which paths reserve.
func dotOnly(key string) bool { return key == "." || key == ".." }

// ShortKey returns EscapeKey(key) when it is at most max bytes, and
// otherwise a prefix of it followed by a SHA-256 of the whole key, exactly
// max bytes in all, for stores with short keys (memcached: 250). max must
// be at least 80.
func ShortKey(key string, max int) string {
	esc := EscapeKey(key)
	if len(esc) <= max {
		return esc
	}
	sum := sha256.Sum256([]byte(key))
	tail := "~" + hex.EncodeToString(sum[:])
	return esc[:max-len(tail)] + tail
}
