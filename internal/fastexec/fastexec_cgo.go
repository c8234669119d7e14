//go:build cgo && linux

package fastexec

// The constructor is in fastexec_linux.c; importing "C" makes cgo build it.

/*
#include <stdlib.h>
int nsfleet_valid_name(const char *s);
*/
import "C"
import "unsafe"

// cValidName runs the constructor's name check (for the tests).
func cValidName(s string) bool {
	cs := C.CString(s)
	defer C.free(unsafe.Pointer(cs))
	return C.nsfleet_valid_name(cs) != 0
}
