package memcachelock

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
)

// A memcached restarted forgets every lock while their holders still run,
// each until its TTL after its last refresh: granting a name sooner could
// make two holders. So, as Redlock asks of a restarted server, a server
// that started less than a TTL ago grants no name whose fence counter it
// lacks. The counter is missing after a restart, on a name's first use and
// after an eviction; only then does the driver ask the server for its
// uptime (one more round trip, on a connection of its own: gomemcache has
// no stats call). A name's first use on a new server therefore waits for
// the server to have run for the TTL.
//
// It needs the server list, so it is on for drivers made by Open; a Driver
// made by New from the caller's client cannot find the key's server. With
// several servers, a name's counter and its lock item may live on different
// ones: the check then covers the restart of the counter's server only.

// uptimeSkew is how much memcached's reported uptime exceeds the time since
// it started: it counts from two seconds before its start (its clock,
// current_time, starts at ITEM_UPDATE_INTERVAL + 2 and uptime is
// current_time - ITEM_UPDATE_INTERVAL).
const uptimeSkew = 2 * time.Second

// young returns an error wrapping ErrNotAcquired when the server that holds
// key started less than ttl ago, nil when it did not or the driver cannot
// tell (no server list).
func (d *Driver) young(key string, ttl time.Duration) error {
	if d.restartMax >= 0 {
		ttl = min(ttl, d.restartMax)
	}
	if d.servers == nil || ttl <= 0 {
		return nil
	}
	addr, err := d.servers.PickServer(key)
	if err != nil {
		return fmt.Errorf("memcachelock: %w", err)
	}
	up, err := d.uptime(addr)
	if err != nil {
		return fmt.Errorf("memcachelock: uptime: %w", err)
	}
	if up -= uptimeSkew; up < ttl {
		return fmt.Errorf("memcachelock: %w", &backend.NotAcquiredError{Reason: fmt.Sprintf(
			"the server started less than a TTL ago and may have forgotten a holder; it grants this name in %v", ttl-up)})
	}
	return nil
}

// uptime asks the server at addr for its uptime, within the timeout.
func (d *Driver) uptime(addr net.Addr) (time.Duration, error) {
	timeout := d.mc.Timeout
	if timeout <= 0 {
		timeout = 500 * time.Millisecond
	}
	c, err := net.DialTimeout(addr.Network(), addr.String(), timeout)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return 0, err
	}
	if _, err := c.Write([]byte("stats\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	up := time.Duration(-1)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return 0, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "END" {
			break
		}
		if s, ok := strings.CutPrefix(line, "STAT uptime "); ok {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("unexpected %q", line)
			}
			up = time.Duration(n) * time.Second
		}
	}
	if up < 0 {
		return 0, fmt.Errorf("no uptime in the server's stats")
	}
	return up, nil
}
