package ferryui

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Who the handler answers: requests addressed to it (Config.Hosts), and
// with the token for reads (unless Config.OpenReads) and actions.

// ServeHTTP serves a request addressed to the handler (see Config.Hosts).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.addressed(r.Host) {
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusForbidden, map[string]string{"error": fmt.Sprintf("this console does not answer to host %q: "+
			"a page of another site may be trying to reach it through its name; if you reach it by this name, start it with --ui-host %s (FERRY_UI_HOSTS; Config.Hosts)",
			r.Host, hostName(r.Host))})
		return
	}
	h.mux.ServeHTTP(w, r)
}

// addressed reports whether host (a request's Host header) names the
// handler: an IP address, localhost, or one of Config.Hosts.
func (h *Handler) addressed(host string) bool {
	name := hostName(host)
	if name == "" {
		return false
	}
	if name == "localhost" || net.ParseIP(name) != nil {
		return true
	}
	for _, ok := range h.cfg.Hosts {
		if ok == "*" || strings.EqualFold(ok, host) || strings.EqualFold(ok, name) {
			return true
		}
	}
	return false
}

// hostName is a Host header without its port and brackets.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	return strings.Trim(host, "[]")
}

// checkToken refuses a request without the token (what: "a read").
func (h *Handler) checkToken(r *http.Request, what string) error {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || h.cfg.Token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(h.cfg.Token)) != 1 {
		return &apiError{http.StatusUnauthorized, what + " needs the console's token: send it as \"Authorization: Bearer <token>\" (FERRY_UI_TOKEN, or the one `ferry ui` printed at start; the console takes it in its header)"}
	}
	return nil
}

func (h *Handler) authorise(r *http.Request) error {
	if h.cfg.ReadOnly {
		return &apiError{http.StatusForbidden, "this console is read-only: actions are refused (start it without --read-only to allow them)"}
	}
	if err := h.checkToken(r, "an action"); err != nil {
		return err
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return &apiError{http.StatusForbidden, fmt.Sprintf("an action from origin %q is refused: only pages served by this console (host %s) may act", origin, r.Host)}
		}
	}
	if mt := strings.TrimSpace(strings.Split(r.Header.Get("Content-Type"), ";")[0]); mt != "application/json" {
		return &apiError{http.StatusUnsupportedMediaType, "an action's body must be JSON (Content-Type: application/json)"}
	}
	return nil
}
