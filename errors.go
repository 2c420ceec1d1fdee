package ferry

import (
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// ValidationError says which event failed validation and why; Emit and
// EmitTx return it wrapped. Its cause is one of ferryevent's sentinels
// (ferryevent.ErrEmptyKey, ferryevent.ErrEventTooLarge, ...): test with
// errors.Is.
type ValidationError = ferryevent.ValidationError

// ErrSchemaMissing is returned (wrapped) when Ferry's tables do not exist.
var ErrSchemaMissing = ferrydriver.ErrSchemaMissing

// ErrMisconfigured is returned (wrapped) by Relay.Run and the drivers for a
// configuration that retrying cannot fix, such as a partition the schema
// does not have. The message names the setting to change.
var ErrMisconfigured = ferrydriver.ErrMisconfigured
