// SPDX-License-Identifier: Apache-2.0

package regroup

/*
#cgo CFLAGS: -I${SRCDIR}/../../abi
#cgo LDFLAGS: -lregroup

// The library never calls back into Go and keeps no pointer it is given past the call, so the
// out-parameters of a call can stay on the Go stack.
#cgo nocallback regroup_abi_version
#cgo nocallback regroup_version_string
#cgo nocallback regroup_status_name
#cgo nocallback regroup_status_message
#cgo nocallback regroup_error_status
#cgo nocallback regroup_error_message
#cgo nocallback regroup_error_free
#cgo nocallback regroup_string_free
#cgo noescape regroup_validate_job
#cgo nocallback regroup_validate_job

#include <stdlib.h>
#include <string.h>
#include "regroup.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"
)

// Status is a status code of the library (regroup_status). Values never change.
type Status int

// The library's status codes.
const (
	StatusOK                 Status = C.REGROUP_OK
	StatusInvalidArgument    Status = C.REGROUP_INVALID_ARGUMENT
	StatusNotFound           Status = C.REGROUP_NOT_FOUND
	StatusValidationFailed   Status = C.REGROUP_VALIDATION_FAILED
	StatusFailedPrecondition Status = C.REGROUP_FAILED_PRECONDITION
	StatusVersionMismatch    Status = C.REGROUP_VERSION_MISMATCH
	StatusResourceExhausted  Status = C.REGROUP_RESOURCE_EXHAUSTED
	StatusInternal           Status = C.REGROUP_INTERNAL
)

// String returns the library's name of the status, such as "REGROUP_NOT_FOUND"
// ("REGROUP_UNKNOWN_STATUS" for a value the library does not know).
func (s Status) String() string {
	return C.GoString(C.regroup_status_name(C.regroup_status(s)))
}

// Message returns the library's one-line description of the status.
func (s Status) Message() string {
	return C.GoString(C.regroup_status_message(C.regroup_status(s)))
}

// Error is a failure reported by the library (or refused by this package before the call, for
// an argument C cannot carry): its status and a message that says what happened, to what, and
// what to do.
type Error struct {
	Op      string // the Go call that failed, such as "Engine.UpsertJob"
	Status  Status
	Message string
	closed  bool // the call was made on a closed Engine or NodeList
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("regroup: ")
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	if e.Message != "" {
		b.WriteString(e.Message)
	} else {
		b.WriteString(e.Status.Message())
	}
	b.WriteString(" (")
	b.WriteString(e.Status.String())
	b.WriteString(")")
	return b.String()
}

// Is reports whether target is ErrClosed and e a call on a closed Engine or NodeList, or target
// is another *Error of the same status whose message is empty or equal to e's: errors.Is(err,
// ErrNotFound) tests the status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t.closed {
		return e.closed
	}
	return t.Status == e.Status && (t.Message == "" || t.Message == e.Message)
}

// Sentinels to test an error's status with errors.Is.
var (
	ErrInvalidArgument    = &Error{Status: StatusInvalidArgument}
	ErrNotFound           = &Error{Status: StatusNotFound}
	ErrValidationFailed   = &Error{Status: StatusValidationFailed}
	ErrFailedPrecondition = &Error{Status: StatusFailedPrecondition}
	ErrVersionMismatch    = &Error{Status: StatusVersionMismatch}
	ErrResourceExhausted  = &Error{Status: StatusResourceExhausted}
	ErrInternal           = &Error{Status: StatusInternal}
)

// ErrClosed matches, with errors.Is, the error of every call on an Engine or a NodeList after its
// Close. Its status is StatusFailedPrecondition.
var ErrClosed = &Error{Status: StatusFailedPrecondition, Message: "closed", closed: true}

// closedError is the error of a call on a closed Engine or NodeList.
func closedError(op, what, constructor string) *Error {
	return &Error{Op: op, Status: StatusFailedPrecondition, closed: true,
		Message: "the " + what + " is closed; create a new one with regroup." + constructor}
}

// StatusOf returns the status of err: StatusOK for nil, the Status of an *Error in err's chain,
// and StatusInternal for any other error.
func StatusOf(err error) Status {
	if err == nil {
		return StatusOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return StatusInternal
}

// newError reports a problem found on the Go side, before calling the library.
func newError(op string, status Status, format string, args ...any) *Error {
	return &Error{Op: op, Status: status, Message: fmt.Sprintf(format, args...)}
}

// takeError turns a call's status and error object into a Go error, freeing the object.
func takeError(op string, status C.regroup_status, cerr *C.regroup_error) error {
	if status == C.REGROUP_OK {
		if cerr != nil {
			C.regroup_error_free(cerr)
		}
		return nil
	}
	e := &Error{Op: op, Status: Status(status)}
	if cerr != nil {
		e.Status = Status(C.regroup_error_status(cerr))
		e.Message = C.GoString(C.regroup_error_message(cerr))
		C.regroup_error_free(cerr)
	}
	if e.Message == "" {
		// The library could not allocate the error object (out of memory).
		e.Message = e.Status.Message()
	}
	return e
}

// cArg is a string argument of a library call, named for the error about it.
type cArg struct{ name, value string }

// cStrings copies args into C strings for one call (nil for an empty one when emptyIsNull); free
// releases them. An argument holding a NUL byte (C would cut it there) is refused by name, never
// echoed: it may be a credential.
func cStrings(op string, emptyIsNull bool, args ...cArg) (out []*C.char, free func(), err error) {
	for _, a := range args {
		if strings.IndexByte(a.value, 0) >= 0 {
			return nil, nil, newError(op, StatusInvalidArgument, "the %s contains a NUL byte", a.name)
		}
	}
	out = make([]*C.char, len(args))
	for i, a := range args {
		if a.value != "" || !emptyIsNull {
			out[i] = C.CString(a.value)
		}
	}
	return out, func() {
		for _, p := range out {
			C.free(unsafe.Pointer(p)) // free(NULL) does nothing
		}
	}, nil
}

// takeString copies a string the library returned into Go memory and frees it.
func takeString(p *C.char) []byte {
	if p == nil {
		return nil
	}
	defer C.regroup_string_free(p)
	n := int(C.strlen(p))
	out := make([]byte, n)
	copy(out, unsafe.Slice((*byte)(unsafe.Pointer(p)), n))
	return out
}

// emptyText stands in for an empty document: the library is given an empty, non-NULL text and
// says what is wrong with it, rather than "the JSON text is NULL".
var emptyText = [1]byte{0}

// cText passes a JSON document to the library without a copy. The library reads it only during
// the call and keeps no pointer to it; a []byte holds no Go pointers, so cgo allows this.
func cText(b []byte) (*C.char, C.size_t) {
	if len(b) == 0 {
		return (*C.char)(unsafe.Pointer(&emptyText[0])), 0
	}
	return (*C.char)(unsafe.Pointer(&b[0])), C.size_t(len(b))
}

// ABI versions as (major << 16) | minor.
const (
	// HeaderABIVersion is the ABI version of the header this package was compiled with:
	// REGROUP_ABI_VERSION_MAJOR and REGROUP_ABI_VERSION_MINOR.
	HeaderABIVersion uint32 = C.REGROUP_ABI_VERSION_MAJOR<<16 | C.REGROUP_ABI_VERSION_MINOR
)

// LibraryABIVersion returns the ABI version of the loaded library as (major << 16) | minor.
func LibraryABIVersion() uint32 { return uint32(C.regroup_abi_version()) }

// LibraryVersion returns the loaded library's release, such as "0.1.0", after checking its ABI.
func LibraryVersion() (string, error) {
	if err := abiCheck(); err != nil {
		return "", err
	}
	return C.GoString(C.regroup_version_string()), nil
}

// checkABIVersion refuses a library of another major, or of an older minor, than the header.
func checkABIVersion(library, header uint32) error {
	libMajor, libMinor := library>>16, library&0xffff
	major, minor := header>>16, header&0xffff
	if libMajor == major && libMinor >= minor {
		return nil
	}
	return &Error{
		Status: StatusVersionMismatch,
		Message: fmt.Sprintf("libregroup has ABI version %d.%d but this Go package was built "+
			"for ABI %d.%d and needs a library of major %d and minor %d or newer; "+
			"install a matching libregroup or rebuild the package against its header",
			libMajor, libMinor, major, minor, major, minor),
	}
}

// abiCheck checks the loaded library's ABI once per process.
var abiCheck = sync.OnceValue(func() error {
	return checkABIVersion(LibraryABIVersion(), HeaderABIVersion)
})

// ValidateJob validates a job spec (JSON) without an engine. It returns the report ({"ok",
// "problems", "config"}) and nil when the job has no errors (it may have warnings); the report
// and an error of status StatusValidationFailed when it has errors; no report and an error of
// status StatusInvalidArgument when the input is not a job spec at all.
func ValidateJob(jobJSON []byte) (report []byte, err error) {
	const op = "ValidateJob"
	if err := abiCheck(); err != nil {
		return nil, err
	}
	text, n := cText(jobJSON)
	var out *C.char
	var cerr *C.regroup_error
	status := C.regroup_validate_job(&out, text, n, &cerr)
	return takeString(out), takeError(op, status, cerr)
}

// cArgs holds a call's string arguments (job ids, node names, uids) as NUL-terminated C strings
// in Go memory, on the caller's stack when they fit. The library reads them only during the call
// and keeps no pointer (the functions are marked noescape), and the buffer holds no Go pointers,
// so cgo allows it. This replaces C.CString and C.free, each a cgo call and a malloc: three
// string arguments that way cost about 180 ns, more than the rest of a SetPodState.
type cArgs struct {
	buf [256]byte
	n   int
}

// str adds s, refusing a string with a NUL byte (C would cut it there and name another job or
// node).
func (a *cArgs) str(op, what, s string) (*C.char, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return nil, newError(op, StatusInvalidArgument, "the %s %q contains a NUL byte", what, s)
	}
	if a.n+len(s)+1 > len(a.buf) {
		b := make([]byte, len(s)+1)
		copy(b, s)
		return (*C.char)(unsafe.Pointer(&b[0])), nil
	}
	p := &a.buf[a.n]
	a.n += copy(a.buf[a.n:], s)
	a.buf[a.n] = 0
	a.n++
	return (*C.char)(unsafe.Pointer(p)), nil
}
