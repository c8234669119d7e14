package spec

import (
	"fmt"
	"strconv"
	"strings"
)

// expand substitutes every {…} placeholder in s. A placeholder is a variable
// followed by integer operations evaluated left to right: {i}, {i+100},
// {i/256}, {i%256}, {i*4+1}. The variable "i" is the index; "name" is the
// namespace name (only where env.name is set) and takes no operations.
// Literal braces are written {{ and }}.
func expand(s string, env expandEnv) (string, error) {
	if !strings.ContainsAny(s, "{}") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '{' && i+1 < len(s) && s[i+1] == '{':
			b.WriteByte('{')
			i++
		case c == '}' && i+1 < len(s) && s[i+1] == '}':
			b.WriteByte('}')
			i++
		case c == '}':
			return "", fmt.Errorf("unmatched '}' at byte %d of %q", i, s)
		case c == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return "", fmt.Errorf("unclosed '{' at byte %d of %q", i, s)
			}
			v, err := evalPlaceholder(s[i+1:i+end], env)
			if err != nil {
				return "", fmt.Errorf("placeholder %q: %w", s[i:i+end+1], err)
			}
			b.WriteString(v)
			i += end
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

type expandEnv struct {
	i        int
	name     string
	hasName  bool
	loopback string // the first loopback address, without its length; "": none
	config   bool   // in a process with a config: {config} stays, for the supervisor
}

func evalPlaceholder(expr string, env expandEnv) (string, error) {
	expr = strings.TrimSpace(expr)
	if expr == "name" {
		if !env.hasName {
			return "", fmt.Errorf("{name} is not available here")
		}
		return env.name, nil
	}
	switch expr {
	case "loopback":
		if env.loopback == "" {
			return "", fmt.Errorf("{loopback} needs a loopback address (loopback_addresses)")
		}
		return env.loopback, nil
	case "config":
		if !env.config {
			return "", fmt.Errorf("{config} names the file of a process's 'config', and this process has none")
		}
		return ConfigPlaceholder, nil
	}
	if !strings.HasPrefix(expr, "i") {
		return "", fmt.Errorf("unknown variable (want {i}, {i+N}, {i/N}, {i%%N}, {i*N}, {name} or {loopback})")
	}
	v := env.i
	rest := strings.TrimSpace(expr[1:])
	for rest != "" {
		op := rest[0]
		rest = strings.TrimSpace(rest[1:])
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 0 {
			return "", fmt.Errorf("operator %q needs a non-negative integer", op)
		}
		arg, err := strconv.Atoi(rest[:n])
		if err != nil {
			return "", err
		}
		rest = strings.TrimSpace(rest[n:])
		switch op {
		case '+':
			v += arg
		case '-':
			v -= arg
		case '*':
			v *= arg
		case '/', '%':
			if arg == 0 {
				return "", fmt.Errorf("division by zero")
			}
			if op == '/' {
				v /= arg
			} else {
				v %= arg
			}
		default:
			return "", fmt.Errorf("unknown operator %q (want + - * / %%)", op)
		}
		if v > 1<<40 || v < -(1<<40) {
			return "", fmt.Errorf("value out of range")
		}
	}
	return strconv.Itoa(v), nil
}
