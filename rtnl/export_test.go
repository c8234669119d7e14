package rtnl

import "golang.org/x/sys/unix"

// ParseLinkForTest exposes parseLink to the fuzz target.
var ParseLinkForTest = parseLink

// IoctlOnly makes d answer by ioctl only, as where sysfs cannot be mounted.
func (d *Devices) IoctlOnly() {
	for _, fd := range d.dirs {
		unix.Close(fd)
	}
	d.dirs = nil
}

// ParseNetconfForTest and NetconfIndexForTest expose the netconf parsers
// to the fuzz target.
var (
	ParseNetconfForTest = parseNetconf
	NetconfIndexForTest = netconfIndex
)

// WalkMessagesForTest runs a Conn's reply walker over b, as the replies to
// n requests numbered from seq: whether all were answered, each one's
// answer and number of replies, and the walker's own error.
func WalkMessagesForTest(b []byte, seq uint32, n int) (done bool, errs []error, replies []int, err error) {
	w := walker{first: seq, calls: make([]call, n), left: n}
	replies = make([]int, n)
	for i := range w.calls {
		w.calls[i].f = func([]byte) error { replies[i]++; return nil }
	}
	err = w.messages(b)
	for _, c := range w.calls {
		errs = append(errs, c.result())
	}
	return w.left == 0, errs, replies, err
}

// ParseEthtoolHeaderForTest exposes parseEthtoolHeader to the fuzz target.
var ParseEthtoolHeaderForTest = parseEthtoolHeader

// ParseAddrForTest exposes parseAddr to the fuzz target.
var ParseAddrForTest = parseAddr
