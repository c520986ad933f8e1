package ctxtree

// A context's state and reason, their names, the state word that holds them
// (its layout, Pack and Unpack) and Next, the one transition rule of a
// state word.

// State is the cancellation state of a Context. The numeric values are part of
// the C ABI: they are what the state word holds.
type State uint32

const (
	Live    State = 0 // not cancelled
	Stopped State = 1 // stop_generating: finish cleanly, produce no more
	Killed  State = 2 // kill: abort now, do not drain
)

func (s State) String() string {
	switch s {
	case Live:
		return "live"
	case Stopped:
		return "stopped"
	case Killed:
		return "killed"
	}
	return "invalid"
}

// Reason says why a context was cancelled. The numeric values are part of the
// C ABI.
type Reason uint32

const (
	ReasonNone               Reason = 0 // still live
	ReasonStopGenerating     Reason = 1
	ReasonKill               Reason = 2
	ReasonClientDisconnected Reason = 3
	ReasonParent             Reason = 4 // propagated from a parent
	ReasonDeadline           Reason = 5
	ReasonConnectionLost     Reason = 6
	ReasonShutdown           Reason = 7

	// NumReasons is the number of reason codes, ReasonNone included: every
	// reason is below it (the header's DC_REASON_COUNT).
	NumReasons = 8
)

var reasonNames = [NumReasons]string{
	"", "stop_generating", "kill", "client_disconnected", "parent",
	"deadline", "connection_lost", "shutdown",
}

// String returns the reason's name as the Python API spells it ("" for ReasonNone).
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "invalid"
}

// Valid reports whether r is one of the defined reasons other than ReasonNone.
func (r Reason) Valid() bool { return r > ReasonNone && r < NumReasons }

// ReasonFromString is the inverse of Reason.String for the defined reasons.
func ReasonFromString(s string) (Reason, bool) {
	for i := Reason(1); i < NumReasons; i++ {
		if reasonNames[i] == s {
			return i, true
		}
	}
	return ReasonNone, false
}

// The state word's layout (part of the C ABI: the header's DC_STATE_MASK,
// DC_REASON_SHIFT, DC_CAUSE_SHIFT and DC_FIELD_MASK are checked equal to
// these at compile time): the state in bits 0-7, the reason in bits 8-15,
// the cause in bits 16-23, zero above.
const (
	StateMask   = 0xff // w & StateMask is the state
	ReasonShift = 8    // w >> ReasonShift & FieldMask is the reason
	CauseShift  = 16   // w >> CauseShift & FieldMask is the cause
	FieldMask   = 0xff // each field is 8 bits
)

// Pack builds a state word; Unpack splits one.
func Pack(s State, r Reason) uint32 { return packCause(s, r, r) }

// packCause adds the cause: the reason at the origin of the cancellation,
// which a propagated context's own reason (ReasonParent) hides.
func packCause(s State, r, cause Reason) uint32 {
	return uint32(s) | uint32(r)<<ReasonShift | uint32(cause)<<CauseShift
}

// stateOf and causeOf read one field of a state word.
func stateOf(w uint32) State  { return State(w & StateMask) }
func causeOf(w uint32) Reason { return Reason(w >> CauseShift & FieldMask) }

// Unpack splits a state word into its state and reason.
func Unpack(w uint32) (State, Reason) { return stateOf(w), Reason(w >> ReasonShift & FieldMask) }

// Next is the one transition rule of a state word: the word a context whose
// word is w has after a cancel to target with reason and cause, and whether
// the cancel changes it. States only move forward, and the reason and cause
// change only with the state: a cancel to a state w is already at or past
// changes nothing. target is Stopped or Killed (Cancel's callers check it).
// It is pure: transition applies it to a context under its lock, and the C
// ABI's dc_state_word_next to a word with no context behind it yet (a
// Python Context before its Go side is made).
func Next(w uint32, target State, reason, cause Reason) (uint32, bool) {
	if old, _ := Unpack(w); old >= target {
		return w, false
	}
	return packCause(target, reason, cause), true
}
