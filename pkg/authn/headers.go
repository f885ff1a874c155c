package authn

import "strings"

// KeyFromHeaders returns the API key of the first header in headers that
// carries one; get reads a header by the name given in headers ("" when
// absent). Authorization (any case) carries a key as "Bearer <key>", the
// scheme in any case; an Authorization header with another scheme, such
// as Basic, carries none and the next header is tried. Any other header
// carries its whole value. Spaces and tabs around the key are trimmed.
func KeyFromHeaders(get func(name string) string, headers []string) (string, bool) {
	for _, h := range headers {
		v := get(h)
		if v == "" {
			continue
		}
		if strings.EqualFold(h, "authorization") {
			v = bearer(v)
		}
		if k := strings.Trim(v, " \t"); k != "" {
			return k, true
		}
	}
	return "", false
}

// bearer returns the credentials of a Bearer authorization value, or ""
// for any other scheme.
func bearer(v string) string {
	const scheme = "bearer"
	v = strings.TrimLeft(v, " \t")
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) || (v[len(scheme)] != ' ' && v[len(scheme)] != '\t') {
		return ""
	}
	return v[len(scheme)+1:]
}
