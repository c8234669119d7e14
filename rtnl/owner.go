package rtnl

import "github.com/nsfleet/nsfleet/netns"

// OwnerMark is the alias nsfleet gives lo in every namespace it makes. The
// kernel keeps it, so ownership survives a crash of nsfleet and needs no
// state file: a namespace whose lo carries it was made (or adopted) by
// nsfleet; any other one is left alone. It lives here, below the engine,
// so that the tools that check the engine's work (doctor) need not import
// the engine.
const OwnerMark = "nsfleet"

// Owned reports whether the namespace's lo carries OwnerMark, that is,
// whether nsfleet made (or adopted) it.
func Owned(h *netns.NS) (bool, error) {
	var owned bool
	err := Inside(h, OpenLite, func(in *Conn) error {
		lo, err := in.LinkByIndex(LoopbackIndex)
		owned = err == nil && lo.Alias == OwnerMark
		return err
	})
	return owned, err
}
