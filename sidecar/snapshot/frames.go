package snapshot

import (
	"strings"
	"unicode/utf8"
)

// How an allocation stack is drawn: its Python frames, clipped, and the
// line that asked.

// stack renders stack id's frames.
func (rd *reducer) stack(id int) (Stack, error) {
	ids := rd.stacks.get(id)
	st := Stack{ID: id, Frames: []Frame{}, FramesTotal: len(ids)}
	for _, fid := range ids {
		if err := rd.m.step(4); err != nil {
			return st, err
		}
		if st.Where != nil && len(st.Frames) >= MaxStackFrames {
			continue // counted in FramesTotal; nothing more is drawn
		}
		fd := rd.frameTab[fid]
		f := Frame{Filename: clip(rd.str(fd, "filename")), Line: rd.int(fd, "line"), Name: clip(rd.str(fd, "name"))}
		if !pythonFrame(f.Filename) {
			continue
		}
		if st.Where == nil && !torchFrame(f.Filename) {
			w := f
			st.Where = &w
		}
		if len(st.Frames) < MaxStackFrames {
			st.Frames = append(st.Frames, f)
		}
	}
	return st, nil
}

// clip bounds a string the reduction carries (file and function names)
// to MaxString bytes, cut at a character's start.
func clip(s string) string {
	if len(s) <= MaxString {
		return s
	}
	cut := MaxString
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// pythonFrame: not a C/C++ frame (those name .cpp/.h files, or nothing).
func pythonFrame(fn string) bool {
	if fn == "" || fn == "??" {
		return false
	}
	for _, ext := range []string{".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cu", ".cuh"} {
		if strings.HasSuffix(fn, ext) {
			return false
		}
	}
	return true
}

// torchFrame: a frame of torch's own Python.
func torchFrame(fn string) bool {
	return strings.Contains(fn, "/torch/") || strings.HasPrefix(fn, "torch/")
}
