package ferry_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The documentation's Go snippets compile. Every ```go block of README.md
// and docs/**/*.md is built, all of them in one `go build` of a scratch
// module joined to this repository's workspace, so that a snippet calling
// an API that does not exist (or no longer does) fails the test. The
// convention, also in AGENTS.md:
//
//   - a block that starts with `package` is a whole file, built as is in a
//     package of its own;
//   - any other block is a fragment, the body of a function. An HTML
//     comment on the line before the block gives that function's
//     signature, with the values the fragment uses but does not make:
//     <!-- snippet: func(ctx context.Context, pool *pgxpool.Pool) error -->.
//     Without one the function is func(). `<!-- snippet: decls -->` marks a
//     block of package-level declarations (types, functions), which the
//     other fragments of the same page may use.
//   - Imports are added from the package names a snippet uses (docImports);
//     the variables a fragment declares at its top level count as used, so
//     that a fragment can end on `relay, err := ...` as prose does.

// docImports maps the package names snippets may use to their import paths.
var docImports = map[string]string{
	"context":       "context",
	"errors":        "errors",
	"fmt":           "fmt",
	"http":          "net/http",
	"json":          "encoding/json",
	"log":           "log",
	"os":            "os",
	"signal":        "os/signal",
	"slog":          "log/slog",
	"sql":           "database/sql",
	"strings":       "strings",
	"syscall":       "syscall",
	"testing":       "testing",
	"time":          "time",
	"uuid":          "github.com/google/uuid",
	"errgroup":      "golang.org/x/sync/errgroup",
	"pgx":           "github.com/jackc/pgx/v5",
	"pgxpool":       "github.com/jackc/pgx/v5/pgxpool",
	"nats":          "github.com/nats-io/nats.go",
	"jetstream":     "github.com/nats-io/nats.go/jetstream",
	"kgo":           "github.com/twmb/franz-go/pkg/kgo",
	"amqp":          "github.com/rabbitmq/amqp091-go",
	"mongo":         "go.mongodb.org/mongo-driver/v2/mongo",
	"options":       "go.mongodb.org/mongo-driver/v2/mongo/options",
	"common":        "github.com/ethereum/go-ethereum/common",
	"abi":           "github.com/ethereum/go-ethereum/accounts/abi",
	"prometheus":    "github.com/prometheus/client_golang/prometheus",
	"promhttp":      "github.com/prometheus/client_golang/prometheus/promhttp",
	"otel":          "go.opentelemetry.io/otel",
	"otlptracehttp": "go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp",
	"propagation":   "go.opentelemetry.io/otel/propagation",
	"resource":      "go.opentelemetry.io/otel/sdk/resource",
	"sdktrace":      "go.opentelemetry.io/otel/sdk/trace",
	"ferry":         "github.com/ferry-dev/ferry",
	"ferryevent":    "github.com/ferry-dev/ferry/ferryevent",
	"ferrydriver":   "github.com/ferry-dev/ferry/ferrydriver",
	"ferrypg":       "github.com/ferry-dev/ferry/ferrydriver/ferrypg",
	"ferrysqlite":   "github.com/ferry-dev/ferry/ferrydriver/ferrysqlite",
	"ferrymysql":    "github.com/ferry-dev/ferry/ferrydriver/ferrymysql",
	"ferrymongo":    "github.com/ferry-dev/ferry/ferrydriver/ferrymongo",
	"ferrysink":     "github.com/ferry-dev/ferry/ferrysink",
	"ferrynats":     "github.com/ferry-dev/ferry/ferrysink/ferrynats",
	"ferrykafka":    "github.com/ferry-dev/ferry/ferrysink/ferrykafka",
	"ferryrabbit":   "github.com/ferry-dev/ferry/ferrysink/ferryrabbit",
	"ferrywebhook":  "github.com/ferry-dev/ferry/ferrysink/ferrywebhook",
	"ferryprom":     "github.com/ferry-dev/ferry/ferryprom",
	"ferryhook":     "github.com/ferry-dev/ferry/ferryhook",
	"ferryotel":     "github.com/ferry-dev/ferry/ferryotel",
	"ferrychain":    "github.com/ferry-dev/ferry/ferrychain",
	"ferrytest":     "github.com/ferry-dev/ferry/ferrytest",
	"ferryproto":    "github.com/ferry-dev/ferry/ferryproto",
}

// docSnippet is one ```go block of a Markdown page.
type docSnippet struct {
	page      string // path relative to the repository root
	line      int    // line of the opening fence
	directive string // what <!-- snippet: ... --> said, or ""
	code      string
}

// docPages lists README.md and every Markdown file under docs/.
func docPages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md"}
	err := filepath.WalkDir("docs", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			pages = append(pages, filepath.ToSlash(path))
		}
		return nil
	})
	require.NoError(t, err)
	return pages
}

var snippetDirective = regexp.MustCompile(`^<!--\s*snippet:\s*(.*?)\s*-->$`)

// extractSnippets returns the ```go blocks of a page, each with the
// snippet directive of the line before it, if any.
func extractSnippets(t *testing.T, page string) []docSnippet {
	t.Helper()
	f, err := os.Open(page)
	require.NoError(t, err)
	defer f.Close()
	var (
		out    []docSnippet
		cur    *docSnippet
		indent string
		prev   string
		n      int
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && trimmed == "```go":
			cur = &docSnippet{page: page, line: n}
			indent = line[:len(line)-len(strings.TrimLeft(line, " \t"))]
			if m := snippetDirective.FindStringSubmatch(strings.TrimSpace(prev)); m != nil {
				cur.directive = m[1]
			}
		case cur != nil && strings.HasPrefix(trimmed, "```"):
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += strings.TrimPrefix(line, indent) + "\n"
		}
		if trimmed != "" {
			prev = line
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s:%d: a ```go block is not closed", page, n)
	return out
}

// snippetFile renders one snippet as a Go file of package pkg, or returns
// an error that names the snippet's place in its page.
func snippetFile(s docSnippet, pkg string, fn int) (string, error) {
	where := fmt.Sprintf("%s:%d", s.page, s.line)
	var body string
	switch {
	case s.directive == "decls":
		body = s.code
	case strings.HasPrefix(s.directive, "func(") || s.directive == "":
		sig := s.directive
		if sig == "" {
			sig = "func()"
		}
		body = fmt.Sprintf("func snippet%d%s {\n%s}\n", fn, strings.TrimPrefix(sig, "func"), s.code)
	default:
		return "", fmt.Errorf("%s: unknown snippet directive %q (want decls or func(...))", where, s.directive)
	}
	src := "package " + pkg + "\n\n" + body
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "snippet.go", src, parser.SkipObjectResolution)
	if err != nil {
		return "", fmt.Errorf("%s: does not parse as %s: %v", where, map[bool]string{true: "declarations", false: "a function body"}[s.directive == "decls"], err)
	}
	// The fragment's own top-level variables count as used.
	type insert struct {
		at   int
		text string
	}
	var inserts []insert
	if s.directive != "decls" {
		fd := f.Decls[0].(*ast.FuncDecl)
		for _, st := range fd.Body.List {
			var names []string
			switch st := st.(type) {
			case *ast.AssignStmt:
				if st.Tok == token.DEFINE {
					for _, l := range st.Lhs {
						if id, ok := l.(*ast.Ident); ok && id.Name != "_" {
							names = append(names, id.Name)
						}
					}
				}
			case *ast.DeclStmt:
				if gd, ok := st.Decl.(*ast.GenDecl); ok && gd.Tok == token.VAR {
					for _, sp := range gd.Specs {
						for _, id := range sp.(*ast.ValueSpec).Names {
							if id.Name != "_" {
								names = append(names, id.Name)
							}
						}
					}
				}
			}
			if len(names) > 0 {
				var b strings.Builder
				for _, nm := range names {
					b.WriteString("; _ = " + nm)
				}
				inserts = append(inserts, insert{fset.Position(st.End()).Offset, b.String()})
			}
		}
	}
	for i := len(inserts) - 1; i >= 0; i-- {
		src = src[:inserts[i].at] + inserts[i].text + src[inserts[i].at:]
	}
	// Imports, from the package names the snippet uses and does not declare.
	declared := map[string]bool{}
	used := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				for _, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok {
						declared[id.Name] = true
					}
				}
			}
		case *ast.RangeStmt:
			if n.Tok == token.DEFINE {
				for _, e := range []ast.Expr{n.Key, n.Value} {
					if id, ok := e.(*ast.Ident); ok {
						declared[id.Name] = true
					}
				}
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				declared[id.Name] = true
			}
		case *ast.Field:
			for _, id := range n.Names {
				declared[id.Name] = true
			}
		case *ast.TypeSpec:
			declared[n.Name.Name] = true
		case *ast.FuncDecl:
			declared[n.Name.Name] = true
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok {
				used[id.Name] = true
			}
		}
		return true
	})
	var imports []string
	for name := range used {
		if path, ok := docImports[name]; ok && !declared[name] {
			imports = append(imports, fmt.Sprintf("\t%s %q", name, path))
		}
	}
	sort.Strings(imports)
	header := "package " + pkg + "\n\n"
	if len(imports) > 0 {
		header += "import (\n" + strings.Join(imports, "\n") + "\n)\n\n"
	}
	first := s.line + 1 // the fence's next line
	if s.directive != "decls" {
		first = s.line // the wrapper's func line comes first
	}
	line := fmt.Sprintf("//line %s:%d\n", s.page, first)
	return header + line + strings.TrimPrefix(src, "package "+pkg+"\n\n"), nil
}

// TestDocsSnippetsCompile builds every Go snippet of the README and docs/.
func TestDocsSnippetsCompile(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "env", "GOWORK").Output()
	require.NoError(t, err)
	gowork := strings.TrimSpace(string(out))
	require.NotEmpty(t, gowork, "the snippets build in this repository's workspace: run the test from a clone, with go.work (GOWORK is off)")
	require.NotEqual(t, "off", gowork, "the snippets build in this repository's workspace: unset GOWORK=off")

	dir := t.TempDir()
	count := 0
	for pi, page := range docPages(t) {
		pkg := fmt.Sprintf("p%d", pi)
		for si, s := range extractSnippets(t, page) {
			count++
			if strings.HasPrefix(strings.TrimSpace(s.code), "package ") {
				d := filepath.Join(dir, fmt.Sprintf("%s_file%d", pkg, si))
				require.NoError(t, os.MkdirAll(d, 0o755))
				require.NoError(t, os.WriteFile(filepath.Join(d, "main.go"),
					[]byte(fmt.Sprintf("//line %s:%d\n%s", s.page, s.line+1, s.code)), 0o644))
				continue
			}
			src, err := snippetFile(s, pkg, si)
			require.NoError(t, err)
			d := filepath.Join(dir, pkg)
			require.NoError(t, os.MkdirAll(d, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(d, fmt.Sprintf("s%d.go", si)), []byte(src), 0o644))
		}
	}
	require.Greater(t, count, 0, "the docs have Go snippets")

	// A workspace of this repository's modules plus the snippets' module.
	var work struct {
		Go      string
		Use     []struct{ DiskPath string }
		Replace []struct {
			Old, New struct{ Path, Version string }
		}
	}
	out, err = exec.Command("go", "work", "edit", "-json", gowork).Output()
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(out, &work))
	wdir := filepath.Dir(gowork)
	abs := func(p string) string {
		if filepath.IsAbs(p) || !(strings.HasPrefix(p, "./") || strings.HasPrefix(p, "../") || p == ".") {
			return p
		}
		return filepath.Join(wdir, p)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "go %s\n\nuse (\n\t.\n", work.Go)
	for _, u := range work.Use {
		fmt.Fprintf(&b, "\t%s\n", abs(u.DiskPath))
	}
	b.WriteString(")\n\n")
	for _, r := range work.Replace {
		old := r.Old.Path
		if r.Old.Version != "" {
			old += " " + r.Old.Version
		}
		nw := abs(r.New.Path)
		if r.New.Version != "" {
			nw += " " + r.New.Version
		}
		fmt.Fprintf(&b, "replace %s => %s\n", old, nw)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.work"), []byte(b.String()), 0o644))
	if sum, err := os.ReadFile(filepath.Join(wdir, "go.work.sum")); err == nil {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "go.work.sum"), sum, 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"),
		[]byte("module ferrydocs.example/snippets\n\ngo "+work.Go+"\n"), 0o644))

	cmd := exec.Command("go", "build", "./...") // several packages: compiled, checked, discarded
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=-buildvcs=false")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "a documentation snippet does not compile (paths are the pages'; the convention is in AGENTS.md):\n%s", strings.ReplaceAll(string(out), dir+"/", ""))
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinksResolve: every relative link of the README and docs/ names
// a file or directory of the repository, and a #fragment into a Markdown
// page names one of its headings.
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	var broken []string
	for _, page := range docPages(t) {
		b, err := os.ReadFile(page)
		require.NoError(t, err)
		inFence := false
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if u, err := url.Parse(target); err == nil && u.Scheme != "" {
					continue
				}
				target, frag, _ := strings.Cut(target, "#")
				file := page
				if target != "" {
					file = filepath.ToSlash(filepath.Join(filepath.Dir(page), target))
				}
				if _, err := os.Stat(file); err != nil {
					broken = append(broken, fmt.Sprintf("%s:%d: %s", page, i+1, m[1]))
					continue
				}
				if frag != "" && strings.HasSuffix(file, ".md") && !mdAnchors(t, file)[frag] {
					broken = append(broken, fmt.Sprintf("%s:%d: %s (no heading %q in %s)", page, i+1, m[1], frag, file))
				}
			}
		}
	}
	require.Empty(t, broken, "links to files that do not exist")
}

var notAnchor = regexp.MustCompile(`[^\p{L}\p{N} _-]`)

// mdAnchors returns the anchors GitHub gives the headings of a Markdown
// page: lower case, punctuation dropped, spaces as hyphens.
func mdAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	anchors := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		h = notAnchor.ReplaceAllString(strings.ToLower(h), "")
		anchors[strings.ReplaceAll(h, " ", "-")] = true
	}
	return anchors
}

// The snippet convention itself: the wrapper, the imports, the used
// variables, and a refusal of what it does not know.
func TestSnippetFile(t *testing.T) {
	t.Parallel()
	src, err := snippetFile(docSnippet{page: "x.md", line: 3, directive: "func(ctx context.Context) error",
		code: "client, err := ferry.NewClient(nil, nil)\nreturn err\n"}, "p", 1)
	require.NoError(t, err)
	require.Contains(t, src, "func snippet1(ctx context.Context) error {")
	require.Contains(t, src, `ferry "github.com/ferry-dev/ferry"`)
	require.Contains(t, src, `context "context"`)
	require.Contains(t, src, "; _ = client; _ = err")
	require.Contains(t, src, "//line x.md:3\n")

	src, err = snippetFile(docSnippet{page: "x.md", line: 3, code: "time := 1\n_ = time.Second\n"}, "p", 2)
	require.NoError(t, err)
	require.Contains(t, src, "func snippet2() {")
	require.NotContains(t, src, `"time"`, "a local name is not a package")

	src, err = snippetFile(docSnippet{page: "x.md", line: 3, directive: "decls", code: "type T struct{ At time.Time }\n"}, "p", 3)
	require.NoError(t, err)
	require.Contains(t, src, `time "time"`)
	require.Contains(t, src, "//line x.md:4\n")

	_, err = snippetFile(docSnippet{page: "x.md", line: 3, directive: "skip", code: "x()\n"}, "p", 4)
	require.ErrorContains(t, err, `x.md:3: unknown snippet directive "skip"`)
	_, err = snippetFile(docSnippet{page: "x.md", line: 3, code: "func (\n"}, "p", 5)
	require.ErrorContains(t, err, "x.md:3: does not parse")
}
