package main

// releaseCommit is the commit a release was cut from, which the release
// tool writes here (tools/release: a release's own commit cannot name
// itself). A binary installed with `go install …/cmd/ferry@v0.1.0` has no
// version control stamp of its own: `ferry version` names this one.
const releaseCommit = "5a521cfd68955125ff7fc84f3fb109288947683a"
