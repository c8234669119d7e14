//go:build cgo && linux

package fastexec

// The constructor is in fastexec_linux.c; importing "C" makes cgo build it.

import "C"
