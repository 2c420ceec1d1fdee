package main

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// check reports what would make a release unusable outside this
// repository: a replace in a go.mod (ignored in a user's build, refused by
// go install), siblings required at other versions than the tree's, an
// import of another module's internal/ package (a contract nobody
// versioned), go directives that differ or name a patch release.
func (ws *workspace) check() ([]string, error) {
	var problems []string
	v, err := ws.version()
	if err != nil {
		return nil, err
	}
	var goVersion string
	for _, m := range ws.modules {
		f, err := ws.modFile(m.dir)
		if err != nil {
			return nil, err
		}
		for _, r := range f.Replace {
			problems = append(problems, fmt.Sprintf("%s/go.mod replaces %s: a replace works only here (go install refuses it, a user's build ignores it); require a version, and let go.work tie the modules", m.dir, r.Old.Path))
		}
		for _, r := range f.Require {
			if ws.released(r.Mod.Path) && r.Mod.Version != v {
				problems = append(problems, fmt.Sprintf("%s/go.mod requires %s %s, where the tree's siblings are %s: run `make release/set VERSION=%s`", m.dir, r.Mod.Path, r.Mod.Version, v, v))
			}
		}
		if f.Go == nil {
			problems = append(problems, m.dir+"/go.mod has no go directive")
			continue
		}
		if !goDirective.MatchString(f.Go.Version) {
			problems = append(problems, fmt.Sprintf("%s/go.mod says go %s: state the oldest Go release the code supports (go 1.N.0), not a patch release", m.dir, f.Go.Version))
		}
		if m.released && goVersion == "" {
			goVersion = f.Go.Version
		} else if m.released && f.Go.Version != goVersion {
			problems = append(problems, fmt.Sprintf("%s/go.mod says go %s, the root go %s: every released module states the same oldest release", m.dir, f.Go.Version, goVersion))
		}
		if f.Toolchain != nil {
			problems = append(problems, fmt.Sprintf("%s/go.mod names toolchain %s: a library does not choose its users' toolchain", m.dir, f.Toolchain.Name))
		}
	}
	internal, err := ws.internalImports()
	if err != nil {
		return nil, err
	}
	docs, err := ws.docProblems(v)
	if err != nil {
		return nil, err
	}
	return append(append(problems, internal...), docs...), nil
}

var goDirective = regexp.MustCompile(`^1\.[0-9]+(\.0)?$`)

// internalImports lists the imports of a package under an internal/
// directory of another module than the importer's.
func (ws *workspace) internalImports() ([]string, error) {
	var problems []string
	for _, m := range ws.modules {
		root := filepath.Join(ws.root, m.dir)
		err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() {
				name := e.Name()
				if p != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || isModule(p)) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, is := range f.Imports {
				path, _ := strconv.Unquote(is.Path.Value)
				if !strings.Contains(path+"/", "/internal/") {
					continue
				}
				if owner := ws.owner(path); owner != nil && owner != m {
					rel, _ := filepath.Rel(ws.root, p)
					problems = append(problems, fmt.Sprintf("%s imports %s, an internal package of module %s: move what it needs to a package that module exports (ferryshared, for what Ferry's modules share)", filepath.ToSlash(rel), path, owner.path))
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return problems, nil
}

func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

// owner is the workspace module an import path belongs to (the longest
// module path it is under), nil for another project's.
func (ws *workspace) owner(path string) *mod {
	var best *mod
	for _, m := range ws.modules {
		if (path == m.path || strings.HasPrefix(path, m.path+"/")) && (best == nil || len(m.path) > len(best.path)) {
			best = m
		}
	}
	return best
}
