package cli

import "strings"

// suggest is the one candidate that name is likely a slip of: the only
// one it is a prefix of, else the only nearest within two edits (an
// adjacent swap counts as one). Short names get fewer edits: "x" would be
// two edits from any two-letter word. "" when none or several fit.
func suggest(name string, candidates []string) string {
	if name == "" {
		return ""
	}
	var prefixed []string
	for _, c := range candidates {
		if c != name && strings.HasPrefix(c, name) {
			prefixed = append(prefixed, c)
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0]
	}
	limit := min(2, len([]rune(name))-1)
	best, bestD, ties := "", limit+1, 0
	for _, c := range candidates {
		if c == name {
			continue
		}
		switch d := editDistance(name, c); {
		case d < bestD:
			best, bestD, ties = c, d, 1
		case d == bestD:
			ties++
		}
	}
	if best == "" || ties > 1 {
		return ""
	}
	return best
}

// editDistance is the optimal-string-alignment distance of a and b:
// insertions, deletions, substitutions and swaps of adjacent letters, each
// one edit (Damerau-Levenshtein, restricted).
func editDistance(a, b string) int {
	s, t := []rune(a), []rune(b)
	// d[i][j] is the distance of s[:i] and t[:j].
	d := make([][]int, len(s)+1)
	for i := range d {
		d[i] = make([]int, len(t)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(s); i++ {
		for j := 1; j <= len(t); j++ {
			cost := 1
			if s[i-1] == t[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && s[i-1] == t[j-2] && s[i-2] == t[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(s)][len(t)]
}
