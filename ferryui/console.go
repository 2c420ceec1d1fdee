package ferryui

import (
	"embed"
	"io/fs"
	"net/http"
)

// The web console: a page and its script and style, embedded, served at /
// beside the API. The script builds the page from the API's JSON with DOM
// calls only (text, never markup), and the policy below lets the page run
// nothing but this script, so a value from an event (a key, a payload, an
// error text) cannot run in an operator's browser.

//go:embed console
var consoleFiles embed.FS

// consolePolicy allows the console's own script, style and API and nothing
// else: no inline script, no other origin, no framing.
const consolePolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (h *Handler) routeConsole() {
	files, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // embedded at build time
	}
	static := http.StripPrefix("/console/", http.FileServerFS(files))
	page, err := fs.ReadFile(files, "index.html")
	if err != nil {
		panic(err)
	}
	secure := func(w http.ResponseWriter) {
		w.Header().Set("Content-Security-Policy", consolePolicy)
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-cache")
	}
	h.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		secure(w)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(page)
	})
	h.mux.HandleFunc("GET /console/", func(w http.ResponseWriter, r *http.Request) {
		secure(w)
		static.ServeHTTP(w, r)
	})
}
