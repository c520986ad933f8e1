package toolcall

type open struct {
	i int
	c rune
}

// fixFast is the package's fix_fast: scan the brackets and strings once,
// then complete only the innermost open container. It returns the completed
// text; ok is false wherever the package raises.
func fixFast(s []rune, allowStr bool) ([]rune, bool) {
	p := &partialParser{allowStr: allowStr}
	var stack []open
	inString := false
	lss, lse := -1, -1 // the last string's start and end quotes
	first := true
	last := open{-1, 0} // the last bracket or quote seen
	for i, c := range s {
		switch c {
		case '"', '[', ']', '{', '}':
		default:
			continue
		}
		if first && c == '"' {
			return joinFix(p.fix(s, true))
		}
		first = false
		last = open{i, c}
		switch {
		case c == '"':
			if !inString {
				inString, lss = true, i
			} else if escapedBefore(s, i)%2 == 0 {
				inString, lse = false, i
			}
		case inString:
		case c == '}' || c == ']':
			if len(stack) == 0 {
				return nil, false
			}
			top := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if (c == '}') != (top.c == '{') {
				return nil, false
			}
		default:
			stack = append(stack, open{i, c})
		}
	}
	if first {
		return joinFix(p.fix(s, true))
	}
	if len(stack) == 0 {
		return s, true
	}
	closing := func(st []open) []rune {
		out := make([]rune, 0, len(st))
		for k := len(st) - 1; k >= 0; k-- {
			if st[k].c == '{' {
				out = append(out, '}')
			} else {
				out = append(out, ']')
			}
		}
		return out
	}
	cat := func(parts ...[]rune) ([]rune, bool) {
		var out []rune
		for _, x := range parts {
			out = append(out, x...)
		}
		return out, true
	}
	top := stack[len(stack)-1]
	below := stack[:len(stack)-1]

	if !allowStr && inString {
		if top.i > lse && top.c == '{' {
			return cat(s[:top.i+1], closing(stack))
		}
		if lc := rfind(s, ",", max(top.i, lse)+1, lss); lc != -1 {
			return cat(s[:lc], closing(stack))
		}
		return truncateBeforeLastKey(s, top.i, lse, closing(stack))
	}
	if inString {
		if top.c == '[' {
			h, t, ok := p.fix(s[lss:], false)
			if !ok {
				return nil, false
			}
			return cat(s[:lss], h, t, closing(stack))
		}
		start := max(lse, top.i)
		if rfind(s, ",", start+1, lss) != -1 {
			lc := rfind(s, ",", start, lss)
			h, t, ok := p.fix(append([]rune{'{'}, s[lc+1:]...), false)
			if !ok {
				return nil, false
			}
			return cat(s[:lc], h[1:], t, closing(below))
		}
		if rfind(s, ":", start+1, lss) != -1 {
			h, t, ok := p.fix(s[lss:], false)
			if !ok {
				return nil, false
			}
			return cat(s[:lss], h, t, closing(stack))
		}
		return cat(s[:lss], closing(stack))
	}
	return fixAfterValue(p, s, stack, last.i, last.c, lss, lse)
}

func joinFix(h, t []rune, ok bool) ([]rune, bool) {
	if !ok {
		return nil, false
	}
	return append(append([]rune{}, h...), t...), true
}

// truncateBeforeLastKey drops the key being written and what follows it.
func truncateBeforeLastKey(s []rune, container, lse int, closing []rune) ([]rune, bool) {
	k := lse
	for {
		k = rfind(s, `"`, container, k)
		if k == -1 {
			return joinFix(s[:container+1], closing, true)
		}
		if escapedBefore(s, k)%2 == 1 {
			k--
			continue
		}
		lc := rfind(s, ",", container, k)
		if lc == -1 {
			return joinFix(s[:container+1], closing, true)
		}
		return joinFix(s[:lc], closing, true)
	}
}

// emptyFix is Python's `not head[1:] + tail[:-1].strip()`.
func emptyFix(h, t []rune) bool {
	if len(h) > 1 {
		return false
	}
	if len(t) > 0 {
		t = t[:len(t)-1]
	}
	return len(stripRunes(t)) == 0
}

// fixAfterValue is fix_fast's ending when the text is not inside a string.
func fixAfterValue(p *partialParser, s []rune, stack []open, li int, lc rune, lss, lse int) ([]rune, bool) {
	closing := func(n int) []rune {
		out := make([]rune, 0, n)
		for k := n - 1; k >= 0; k-- {
			if stack[k].c == '{' {
				out = append(out, '}')
			} else {
				out = append(out, ']')
			}
		}
		return out
	}
	all, below := len(stack), len(stack)-1
	top := stack[below]
	cat := func(parts ...[]rune) ([]rune, bool) {
		var out []rune
		for _, x := range parts {
			out = append(out, x...)
		}
		return out, true
	}
	// fixBrace completes "{" + s[comma+1:] and splices it after the comma.
	fixBrace := func(comma, nonEmptyClose int) ([]rune, bool) {
		h, t, ok := p.fix(append([]rune{'{'}, s[comma+1:]...), false)
		if !ok {
			return nil, false
		}
		if emptyFix(h, t) {
			return cat(s[:comma], h[1:], t, closing(below))
		}
		return cat(s[:comma+1], h[1:], t, closing(nonEmptyClose))
	}
	if comma := rfind(s, ",", max(lse, li)+1, len(s)); comma != -1 {
		if len(stripRunes(s[comma+1:])) == 0 {
			return cat(s[:comma], closing(all))
		}
		if top.c != '[' {
			return nil, false
		}
		h, t, ok := p.fix(append([]rune{'['}, s[comma+1:]...), false)
		if !ok {
			return nil, false
		}
		if emptyFix(h, t) {
			return cat(s[:comma], h[1:], t, closing(below))
		}
		return cat(s[:comma+1], h[1:], t, closing(below))
	}
	switch lc {
	case ']', '}':
		if len(stripRunes(s[li+1:])) != 0 {
			return nil, false
		}
		return cat(s, closing(all))
	case '[', '{':
		h, t, ok := p.fix(s[li:], false)
		if !ok {
			return nil, false
		}
		return cat(s[:li], h, t, closing(below))
	}
	if top.c == '[' {
		return cat(s, closing(all))
	}
	colon := rfind(s, ":", lse, len(s))
	comma := rfind(s, ",", top.i+1, lss)
	if comma == -1 {
		h, t, ok := p.fix(s[top.i:], false)
		if !ok {
			return nil, false
		}
		return cat(s[:top.i], h, t, closing(below))
	}
	if colon == -1 {
		if rfind(s, ":", max(top.i, comma)+1, lss) != -1 {
			return cat(s, closing(all))
		}
		return fixBrace(comma, all)
	}
	if colon <= comma {
		return nil, false
	}
	return fixBrace(comma, below)
}
