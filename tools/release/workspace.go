package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// devOnly are the directories of modules that go.work uses for development
// and no release tags: the examples, the side-by-side benchmark, the
// deployment files and their checks (the image builder, the Helm chart,
// the alert rules), the programs/ that prove a release, and this tool.
var devOnly = []string{"bench", "deploy", "examples/", "programs/", "tools/"}

// workspace is the repository's modules, as go.work lists them.
type workspace struct {
	root    string
	modules []*mod // released first, in go.work's order
}

type mod struct {
	dir      string // relative to the root, "." for the root module
	path     string
	released bool
}

// tag is the module's tag for version v (a module in a subdirectory is
// tagged with the directory's path in front).
func (m *mod) tag(v string) string {
	if m.dir == "." {
		return v
	}
	return m.dir + "/" + v
}

func loadWorkspace(root string) (*workspace, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, fmt.Errorf("read go.work (run from the repository's root): %w", err)
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	ws := &workspace{root: root}
	for _, u := range wf.Use {
		dir := filepath.ToSlash(filepath.Clean(u.Path))
		f, err := ws.modFile(dir)
		if err != nil {
			return nil, err
		}
		m := &mod{dir: dir, path: f.Module.Mod.Path, released: true}
		for _, d := range devOnly {
			if dir == strings.TrimSuffix(d, "/") || strings.HasPrefix(dir, d) {
				m.released = false
			}
		}
		ws.modules = append(ws.modules, m)
	}
	slices.SortStableFunc(ws.modules, func(a, b *mod) int {
		switch {
		case a.released == b.released:
			return 0
		case a.released:
			return -1
		}
		return 1
	})
	return ws, nil
}

func (ws *workspace) modFile(dir string) (*modfile.File, error) {
	p := filepath.Join(ws.root, dir, "go.mod")
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	return modfile.Parse(p, data, nil)
}

func (ws *workspace) writeModFile(dir string, f *modfile.File) error {
	f.Cleanup()
	data, err := f.Format()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(ws.root, dir, "go.mod"), data, 0o644)
}

// released reports whether path is a released module's.
func (ws *workspace) released(path string) bool {
	return slices.ContainsFunc(ws.modules, func(m *mod) bool { return m.released && m.path == path })
}

// version is the version the tree's modules require their siblings at
// (check says whether they agree).
func (ws *workspace) version() (string, error) {
	for _, m := range ws.modules {
		f, err := ws.modFile(m.dir)
		if err != nil {
			return "", err
		}
		for _, r := range f.Require {
			if ws.released(r.Mod.Path) {
				return r.Mod.Version, nil
			}
		}
	}
	return "", fmt.Errorf("no module requires a sibling: no version to release")
}

// setVersion makes every require of a released module name v, and go.work
// replace those modules at v by their directories (a proxy may not have v
// yet: the workspace builds them from this tree).
func (ws *workspace) setVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v {
		return fmt.Errorf("version %q is not a canonical semantic version (v0.1.0)", v)
	}
	for _, m := range ws.modules {
		f, err := ws.modFile(m.dir)
		if err != nil {
			return err
		}
		for _, r := range f.Require {
			if ws.released(r.Mod.Path) && r.Mod.Version != v {
				if err := f.AddRequire(r.Mod.Path, v); err != nil {
					return err
				}
			}
		}
		if err := ws.writeModFile(m.dir, f); err != nil {
			return err
		}
	}
	p := filepath.Join(ws.root, "go.work")
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	wf, err := modfile.ParseWork(p, data, nil)
	if err != nil {
		return err
	}
	for _, r := range slices.Clone(wf.Replace) {
		if ws.released(r.Old.Path) {
			if err := wf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return err
			}
		}
	}
	for _, m := range ws.modules {
		if m.released {
			if err := wf.AddReplace(m.path, v, "./"+m.dir, ""); err != nil {
				return err
			}
		}
	}
	wf.Cleanup()
	if err := os.WriteFile(p, groupReplaces(modfile.Format(wf.Syntax)), 0o644); err != nil {
		return err
	}
	return ws.setDocVersion(v)
}

// groupReplaces puts a go.work's one-line replace directives into one
// block, with a comment that says why they are there.
func groupReplaces(data []byte) []byte {
	var rest, replaces []string
	for line := range strings.Lines(string(data)) {
		if r, ok := strings.CutPrefix(line, "replace github.com/ferry-dev/"); ok {
			replaces = append(replaces, "\tgithub.com/ferry-dev/"+r)
			continue
		}
		rest = append(rest, line)
	}
	out := strings.TrimRight(strings.Join(rest, ""), "\n") + "\n"
	if len(replaces) > 0 {
		out += "\n// The released modules are built from this tree at the version the go.mod\n" +
			"// files require (no proxy may have it yet: a release is tagged after it).\n" +
			"replace (\n" + strings.Join(replaces, "") + ")\n"
	}
	return []byte(out)
}

// run runs a command in dir with env added to the process's, and returns
// its output; an error carries the output.
func run(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s (in %s): %w\n%s", name, strings.Join(args, " "), dir, err, out.String())
	}
	return out.String(), nil
}

func joinLines(lines []string) string { return strings.Join(lines, "\n  ") }
