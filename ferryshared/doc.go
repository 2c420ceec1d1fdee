// Package ferryshared holds what Ferry's modules share that is not part of
// Ferry's API: the retry backoff of the sinks and the chain source, what
// the backends share to implement the driver seam alike (driverkit), and the
// helpers of Ferry's own tests (a fault-injecting TCP proxy, child
// processes to SIGKILL, an in-memory sink, a goroutine-safe buffer, what a
// test does when a service is absent). Each module of the repository may
// import it; an internal/ package could not be shared across modules without
// being a contract nobody versioned. It is versioned with the root module and
// carries no compatibility promise: applications should not import it (see
// docs/compatibility.md).
package ferryshared
