package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture writes files (path: content) under a new directory.
func fixture(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// A workspace of a root module and two in subdirectories, the way
// Ferry's is laid out; each test changes what it needs.
func tree() map[string]string {
	return map[string]string{
		"go.work":            "go 1.26.0\n\nuse (\n\t.\n\t./sinks/a\n\t./examples/x\n)\n",
		"go.mod":             "module example.com/f\n\ngo 1.26.0\n",
		"internal/util/u.go": "package util\n",
		"api.go":             "package f\n\nimport _ \"example.com/f/internal/util\"\n",
		"sinks/a/go.mod":     "module example.com/f/sinks/a\n\ngo 1.26.0\n\nrequire example.com/f v0.1.0\n",
		"sinks/a/a.go":       "package a\n\nimport _ \"example.com/f\"\n",
		"examples/x/go.mod":  "module example.com/f/examples/x\n\ngo 1.26.0\n\nrequire (\n\texample.com/f v0.1.0\n\texample.com/f/sinks/a v0.1.0\n)\n",
		"examples/x/x.go":    "package main\n\nimport _ \"example.com/f/sinks/a\"\n\nfunc main() {}\n",
	}
}

func checkTree(t *testing.T, files map[string]string) []string {
	t.Helper()
	ws, err := loadWorkspace(fixture(t, files))
	if err != nil {
		t.Fatal(err)
	}
	problems, err := ws.check()
	if err != nil {
		t.Fatal(err)
	}
	return problems
}

func requireProblem(t *testing.T, problems []string, want string) {
	t.Helper()
	for _, p := range problems {
		if strings.Contains(p, want) {
			return
		}
	}
	t.Fatalf("no problem says %q among %q", want, problems)
}

func TestCheckPassesATidyTree(t *testing.T) {
	if problems := checkTree(t, tree()); len(problems) > 0 {
		t.Fatalf("problems in a tree that has none: %q", problems)
	}
}

func TestCheckRefusesAnotherModulesInternalPackage(t *testing.T) {
	files := tree()
	files["sinks/a/a.go"] = "package a\n\nimport _ \"example.com/f/internal/util\"\n"
	requireProblem(t, checkTree(t, files), "sinks/a/a.go imports example.com/f/internal/util, an internal package of module example.com/f")
	// A test file counts too: it is compiled by whoever runs the module's tests.
	files = tree()
	files["examples/x/x_test.go"] = "package main\n\nimport _ \"example.com/f/internal/util\"\n"
	requireProblem(t, checkTree(t, files), "examples/x/x_test.go imports example.com/f/internal/util")
}

func TestCheckRefusesAReplace(t *testing.T) {
	files := tree()
	files["sinks/a/go.mod"] += "\nreplace example.com/f => ../..\n"
	requireProblem(t, checkTree(t, files), "sinks/a/go.mod replaces example.com/f")
}

func TestCheckRefusesAnotherSiblingVersion(t *testing.T) {
	files := tree()
	files["examples/x/go.mod"] = strings.Replace(files["examples/x/go.mod"], "example.com/f/sinks/a v0.1.0", "example.com/f/sinks/a v0.2.0", 1)
	requireProblem(t, checkTree(t, files), "examples/x/go.mod requires example.com/f/sinks/a v0.2.0, where the tree's siblings are v0.1.0")
}

func TestCheckRefusesAPatchReleaseGoDirective(t *testing.T) {
	files := tree()
	files["sinks/a/go.mod"] = strings.Replace(files["sinks/a/go.mod"], "go 1.26.0", "go 1.26.8", 1)
	requireProblem(t, checkTree(t, files), "sinks/a/go.mod says go 1.26.8")
}

func TestModulesInSubdirectoriesAreTaggedWithTheirPath(t *testing.T) {
	ws, err := loadWorkspace(fixture(t, tree()))
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, m := range ws.modules {
		if m.released {
			tags = append(tags, m.tag("v0.1.0"))
		}
	}
	if got := strings.Join(tags, " "); got != "v0.1.0 sinks/a/v0.1.0" {
		t.Fatalf("tags %q; the examples are not released", got)
	}
}

func TestNextPatch(t *testing.T) {
	for v, want := range map[string]string{"v0.1.0": "v0.1.1", "v1.2.9": "v1.2.10"} {
		if got := nextPatch(v); got != want {
			t.Errorf("nextPatch(%s) = %s, want %s", v, got, want)
		}
	}
}

func TestCheckRefusesDocsNamingAnotherVersion(t *testing.T) {
	files := tree()
	files["README.md"] = "```sh\ngo get example.com/f@v0.1.0\ngo get example.com/f/sinks/a@v0.1.0\n```\n"
	files["docs/start.md"] = "go install example.com/f/cmd/x@v0.0.9\n"
	requireProblem(t, checkTree(t, files), "docs/start.md:1 names example.com/f/cmd/x@v0.0.9, where the tree's siblings are v0.1.0")
	for _, p := range checkTree(t, files) {
		if strings.Contains(p, "README.md") {
			t.Fatalf("README names the tree's version: %q", p)
		}
	}
}

func TestSetVersionRewritesTheDocs(t *testing.T) {
	files := tree()
	files["README.md"] = "go get example.com/f@v0.1.0 # core\ngo get example.com/f/sinks/a@v0.1.0\nother.example/x@v1.2.3 stays\n"
	root := fixture(t, files)
	ws, err := loadWorkspace(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.setVersion("v0.2.0"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := "go get example.com/f@v0.2.0 # core\ngo get example.com/f/sinks/a@v0.2.0\nother.example/x@v1.2.3 stays\n"
	if string(data) != want {
		t.Fatalf("README after set v0.2.0:\n%s\nwant:\n%s", data, want)
	}
}
