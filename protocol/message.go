package protocol

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Delimiter separates routing identities from the message proper.
const Delimiter = "<IDS|MSG>"

// Version is the messaging protocol version gpumem speaks.
const Version = "5.3"

// Default limits for decoding (and for what the transport accepts).
const (
	DefaultMaxFrameBytes = 64 << 20
	DefaultMaxFrames     = 1024
)

// ErrMalformed is wrapped by every Decode error about the shape of a message.
var ErrMalformed = errors.New("malformed message")

// ErrBadSignature is wrapped by Decode when the HMAC does not verify.
var ErrBadSignature = errors.New("bad message signature")

// Header is a message header (also the parent_header of a reply).
type Header struct {
	MsgID    string `json:"msg_id"`
	MsgType  string `json:"msg_type"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	Version  string `json:"version"`
	// SubshellID names the subshell a request is for (JEP 91, ipykernel
	// >= 7); "" for the main shell.
	SubshellID string `json:"subshell_id,omitempty"`
}

// IsZero reports whether h is the empty header ({} on the wire).
func (h Header) IsZero() bool { return h == Header{} }

// Time parses Date; the zero time when absent or unparsable.
func (h Header) Time() time.Time {
	t, err := time.Parse(time.RFC3339Nano, h.Date)
	if err != nil {
		return time.Time{}
	}
	return t
}

// NewHeader returns a header with a fresh msg_id: kernels reject a repeated
// signature, so no two messages may share one.
func NewHeader(msgType, session, username string) Header {
	return Header{
		MsgID:    uuid.NewString(),
		MsgType:  msgType,
		Session:  session,
		Username: username,
		Date:     time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"),
		Version:  Version,
	}
}

// Message is one Jupyter message. Decode's result aliases the frames it was
// given.
type Message struct {
	Identities [][]byte // routing prefix: ZeroMQ identities or an iopub topic
	Header     Header
	Parent     Header          // zero when the message has no parent
	Metadata   json.RawMessage // a JSON object; nil encodes as {}
	Content    json.RawMessage // a JSON object; nil encodes as {}
	Buffers    [][]byte
}

// Limits bounds what Decode accepts. Zero fields take the defaults.
type Limits struct {
	MaxFrameBytes int64 // largest single frame; default DefaultMaxFrameBytes
	MaxFrames     int   // most frames in one message; default DefaultMaxFrames
}

func (l Limits) withDefaults() Limits {
	if l.MaxFrameBytes <= 0 {
		l.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if l.MaxFrames <= 0 {
		l.MaxFrames = DefaultMaxFrames
	}
	return l
}

// maxMessageBytes bounds a whole message: twice the frame limit.
func (l Limits) maxMessageBytes() int64 { return 2 * l.MaxFrameBytes }

// Sign returns the lowercase hex HMAC-SHA256 of the four signed parts, keyed
// by key; "" when key is empty (unsigned messages).
func Sign(key []byte, header, parent, metadata, content []byte) string {
	if len(key) == 0 {
		return ""
	}
	return string(sign(key, header, parent, metadata, content))
}

func sign(key []byte, parts ...[]byte) []byte {
	mac := hmac.New(sha256.New, key)
	for _, p := range parts {
		mac.Write(p)
	}
	sum := mac.Sum(nil)
	out := make([]byte, hex.EncodedLen(len(sum)))
	hex.Encode(out, sum)
	return out
}

var emptyObject = []byte("{}")

// Encode returns the frames of msg, signed with key:
// [identities…, "<IDS|MSG>", hmac, header, parent, metadata, content, buffers…].
// metadata and content must be JSON objects; nil means {}.
func Encode(msg *Message, key []byte) ([][]byte, error) {
	if msg.Header.MsgID == "" || msg.Header.MsgType == "" {
		return nil, fmt.Errorf("encode: header needs msg_id and msg_type")
	}
	header, err := json.Marshal(msg.Header)
	if err != nil {
		return nil, fmt.Errorf("encode header: %w", err)
	}
	parent := emptyObject
	if !msg.Parent.IsZero() {
		if parent, err = json.Marshal(msg.Parent); err != nil {
			return nil, fmt.Errorf("encode parent header: %w", err)
		}
	}
	metadata, err := objectOrEmpty(msg.Metadata, "metadata")
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	content, err := objectOrEmpty(msg.Content, "content")
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	frames := make([][]byte, 0, len(msg.Identities)+6+len(msg.Buffers))
	frames = append(frames, msg.Identities...)
	var sig []byte
	if len(key) > 0 {
		sig = sign(key, header, parent, metadata, content)
	}
	frames = append(frames, []byte(Delimiter), sig, header, parent, metadata, content)
	frames = append(frames, msg.Buffers...)
	return frames, nil
}

func objectOrEmpty(raw json.RawMessage, what string) ([]byte, error) {
	if len(raw) == 0 {
		return emptyObject, nil
	}
	if !isJSONObject(raw) {
		// ipykernel sends no execute_reply at all for metadata null.
		return nil, fmt.Errorf("%s must be a JSON object, got %s", what, clip(raw, 40))
	}
	return raw, nil
}

func isJSONObject(b []byte) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// Decode parses and verifies the frames of one message. With a non-empty key
// the HMAC must verify (constant-time); with an empty key the signature is
// not checked. Every count and length is checked first, so hostile input
// gives an error, never a panic.
func Decode(frames [][]byte, key []byte, lim Limits) (*Message, error) {
	lim = lim.withDefaults()
	if len(frames) > lim.MaxFrames {
		return nil, fmt.Errorf("%w: %d frames, limit %d", ErrMalformed, len(frames), lim.MaxFrames)
	}
	var total int64
	for i, f := range frames {
		if int64(len(f)) > lim.MaxFrameBytes {
			return nil, fmt.Errorf("%w: frame %d is %d bytes, limit %d", ErrMalformed, i, len(f), lim.MaxFrameBytes)
		}
		total += int64(len(f))
	}
	if total > lim.maxMessageBytes() {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrMalformed, total, lim.maxMessageBytes())
	}
	delim := -1
	for i, f := range frames {
		if string(f) == Delimiter {
			delim = i
			break
		}
	}
	if delim < 0 {
		return nil, fmt.Errorf("%w: no %s delimiter in %d frames", ErrMalformed, Delimiter, len(frames))
	}
	if len(frames)-delim < 6 {
		return nil, fmt.Errorf("%w: %d frames after the delimiter, want at least 5", ErrMalformed, len(frames)-delim-1)
	}
	sig := frames[delim+1]
	header, parent, metadata, content := frames[delim+2], frames[delim+3], frames[delim+4], frames[delim+5]
	if len(key) > 0 {
		if len(sig) != hex.EncodedLen(sha256.Size) {
			return nil, fmt.Errorf("%w: signature is %d bytes, want %d", ErrBadSignature, len(sig), hex.EncodedLen(sha256.Size))
		}
		if !hmac.Equal(sig, sign(key, header, parent, metadata, content)) {
			return nil, ErrBadSignature
		}
	}
	msg := &Message{
		Identities: frames[:delim],
		Metadata:   metadata,
		Content:    content,
		Buffers:    frames[delim+6:],
	}
	if err := decodeHeader(header, &msg.Header); err != nil {
		return nil, fmt.Errorf("%w: header: %w", ErrMalformed, err)
	}
	if msg.Header.MsgID == "" || msg.Header.MsgType == "" {
		return nil, fmt.Errorf("%w: header lacks msg_id or msg_type", ErrMalformed)
	}
	if err := decodeHeader(parent, &msg.Parent); err != nil {
		return nil, fmt.Errorf("%w: parent header: %w", ErrMalformed, err)
	}
	if !isJSONObject(metadata) {
		return nil, fmt.Errorf("%w: metadata is not a JSON object: %s", ErrMalformed, clip(metadata, 40))
	}
	if !isJSONObject(content) {
		return nil, fmt.Errorf("%w: content is not a JSON object: %s", ErrMalformed, clip(content, 40))
	}
	return msg, nil
}

func decodeHeader(b []byte, h *Header) error {
	if !isJSONObject(b) {
		return fmt.Errorf("not a JSON object: %s", clip(b, 40))
	}
	if err := json.Unmarshal(b, h); err != nil {
		return err
	}
	return nil
}
