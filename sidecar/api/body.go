package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// jsonBody is what a request's JSON body may be. Every body needs
// Content-Type application/json, which a browser cannot send without a
// CORS preflight, which this API never answers.
type jsonBody struct {
	limit    int64 // bytes
	optional bool  // an empty body is no body: the target is left as it is
	strict   bool  // unknown fields are errors
}

// decode reads one JSON object into v. It returns the status to answer
// with an error; the error's text begins with "body".
func (b jsonBody) decode(w http.ResponseWriter, r *http.Request, v any) (int, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, b.limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return http.StatusRequestEntityTooLarge, fmt.Errorf("body is over %d bytes", b.limit)
		}
		return http.StatusBadRequest, fmt.Errorf("body could not be read: %w", err)
	}
	empty := len(bytes.TrimSpace(body)) == 0
	if empty && b.optional {
		return 0, nil
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return http.StatusUnsupportedMediaType, errors.New("body must have Content-Type application/json")
	}
	if empty {
		return http.StatusBadRequest, errors.New("body is empty: send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if b.strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return http.StatusBadRequest, fmt.Errorf("body: %w", err)
	}
	if dec.More() {
		return http.StatusBadRequest, errors.New("body: trailing data after the JSON object")
	}
	return 0, nil
}
