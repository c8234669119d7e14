package rtnl

// ParseLinkForTest exposes parseLink to the fuzz target.
var ParseLinkForTest = parseLink

// IoctlOnly makes d answer by ioctl only, as where sysfs cannot be mounted.
func (d *Devices) IoctlOnly() {
	if d.sys >= 0 {
		d.sys = -1 // the fd is left to the test's end: this is a test
	}
}

// ParseNetconfForTest exposes parseNetconf to the fuzz target.
var ParseNetconfForTest = parseNetconf

// WalkMessagesForTest runs a Conn's reply walker over b, as the reply to
// request number seq.
func WalkMessagesForTest(b []byte, seq uint32) (bool, error) {
	s := &sock{seq: seq}
	intr := false
	return s.messages(b, 0, &intr, func([]byte) {})
}
