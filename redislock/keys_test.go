package redislock

import "testing"

func TestKeysFor(t *testing.T) {
	k := keysFor("a:b{c}")
	want := keys{lock: "{a%3Ab%7Bc%7D}:lock", fence: "{a%3Ab%7Bc%7D}:fence", channel: "{a%3Ab%7Bc%7D}:released",
		queue: "{a%3Ab%7Bc%7D}:queue", live: "{a%3Ab%7Bc%7D}:live", hand: "{a%3Ab%7Bc%7D}:hand"}
	if k != want {
		t.Fatalf("keysFor = %+v, want %+v", k, want)
	}
}
