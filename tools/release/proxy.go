package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// A file module proxy: GOPROXY=file://DIR serves DIR/<module>/@v/list,
// <version>.info, <version>.mod and <version>.zip, as a module proxy
// does over HTTP.

// source is where a module's files come from: the working tree, or a
// git revision of the repository at root.
type source struct {
	root string
	rev  string // "": the working tree
}

// addToProxy writes module m of the workspace at version v, from src,
// into the proxy at dir.
func addToProxy(dir string, m *mod, v string, src source) error {
	esc, err := module.EscapePath(m.path)
	if err != nil {
		return err
	}
	at := filepath.Join(dir, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	mv := module.Version{Path: m.path, Version: v}
	var zbuf bytes.Buffer
	var goMod []byte
	when := time.Now().UTC()
	if src.rev == "" {
		err = zip.CreateFromDir(&zbuf, mv, filepath.Join(src.root, m.dir))
		if err == nil {
			goMod, err = os.ReadFile(filepath.Join(src.root, m.dir, "go.mod"))
		}
	} else {
		subdir := ""
		if m.dir != "." {
			subdir = m.dir + "/"
		}
		err = zip.CreateFromVCS(&zbuf, mv, src.root, src.rev, subdir)
		if err == nil {
			var out string
			out, err = run(src.root, nil, "git", "show", src.rev+":"+strings.TrimPrefix(subdir+"go.mod", "./"))
			goMod = []byte(out)
		}
		if err == nil {
			var out string
			if out, err = run(src.root, nil, "git", "log", "-1", "--format=%cI", src.rev); err == nil {
				when, err = time.Parse(time.RFC3339, strings.TrimSpace(out))
			}
		}
	}
	if err != nil {
		return fmt.Errorf("module %s %s: %w", m.path, v, err)
	}
	info, _ := json.Marshal(map[string]any{"Version": v, "Time": when.UTC().Format(time.RFC3339)})
	for name, data := range map[string][]byte{v + ".zip": zbuf.Bytes(), v + ".mod": goMod, v + ".info": info} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			return err
		}
	}
	list := filepath.Join(at, "list")
	old, _ := os.ReadFile(list)
	versions := strings.Fields(string(old))
	if !slices.Contains(versions, v) {
		versions = append(versions, v)
	}
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// forgetCached removes the workspace's modules from the module cache: a
// proxy of this tree may serve other bytes under a version than the last
// one did, and the go command would use what it cached.
func forgetCached() error {
	out, err := run(".", nil, "go", "env", "GOMODCACHE")
	if err != nil {
		return err
	}
	cache := strings.TrimSpace(out)
	for _, d := range []string{filepath.Join(cache, "github.com", "ferry-dev"), filepath.Join(cache, "cache", "download", "github.com", "ferry-dev")} {
		// The module cache's directories are read-only.
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	return nil
}

// serveProxy serves a module proxy on a loopback port: the modules in the
// proxy directory dir, and every other from the usual proxy (the first of
// go env GOPROXY), whose refusals of what it does not have (403, on this
// project's machines, where the go command expects 404) become 404s, as a
// real proxy answers; a version list it refuses comes from the module
// cache. It returns the proxy's URL and a function that
// stops it.
func serveProxy(dir string) (string, func(), error) {
	out, err := run(".", nil, "go", "env", "GOPROXY")
	if err != nil {
		return "", nil, err
	}
	upstream := "https://proxy.golang.org"
	for p := range strings.FieldsFuncSeq(strings.TrimSpace(out), func(r rune) bool { return r == ',' || r == '|' }) {
		if p != "direct" && p != "off" {
			upstream = strings.TrimSuffix(p, "/")
			break
		}
	}
	out, err = run(".", nil, "go", "env", "GOMODCACHE")
	if err != nil {
		return "", nil, err
	}
	cache := strings.TrimSpace(out)
	files := http.FileServer(http.Dir(dir))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(path.Clean(r.URL.Path)))); err == nil {
			files.ServeHTTP(w, r)
			return
		}
		resp, err := http.Get(upstream + r.URL.Path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		status := resp.StatusCode
		if status == http.StatusForbidden && strings.HasSuffix(r.URL.Path, "/@v/list") {
			// This project's machines' proxy refuses to list some modules'
			// versions (github.com/go-mysql-org/go-mysql): the versions the
			// module cache has stand in, so that go get -u can run.
			if list, err := os.ReadFile(filepath.Join(cache, "cache", "download", filepath.FromSlash(path.Clean(r.URL.Path)))); err == nil {
				_, _ = w.Write(list)
				return
			}
		}
		if status == http.StatusForbidden || status == http.StatusGone {
			status = http.StatusNotFound
		}
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(status)
		_, _ = io.Copy(w, resp.Body)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// proxyEnv is the environment of a go command that resolves modules from
// the proxy at url only (serveProxy), with no go.work, and Ferry's modules'
// checksums kept out of the checksum database. The go command's module
// index is off (GODEBUG=goindex=0): it keeps, in the build cache, the files
// and imports of each module directory of the module cache, taking them for
// immutable; forgetCached removes a version's directory, but a proxy of
// this tree serves other bytes under that version than the last did, and
// the index of the old ones built the new ("undefined: relayHealth",
// "could not import mime") until it was turned off.
func proxyEnv(url string) []string {
	return []string{"GOWORK=off", "GOPROXY=" + url, "GONOSUMDB=github.com/ferry-dev", "GOFLAGS=-mod=mod", "GODEBUG=goindex=0"}
}
