package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// KeepReply is what POST /api/v1/kernels/{id}/keep did: the kernel counts
// as used from KeptAt, so a cull warning that stood is withdrawn.
type KeepReply struct {
	KernelID string    `json:"kernel_id"`
	KeptAt   time.Time `json:"kept_at"`
	// Text is the daemon's sentence for the user (which notebook, and when
	// it may be warned again).
	Text string `json:"text"`
}

func (s *Server) serveKeep(w http.ResponseWriter, r *http.Request, c caller) {
	reply, err := s.backend.KeepKernel(r.Context(), c.kernel)
	if s.notServed(w, r, err, "this daemon culls no kernel") {
		return
	}
	var body json.RawMessage
	if err == nil {
		body, err = json.Marshal(reply)
	}
	s.writeKernelReply(w, r, c.kernel.ID, body, err)
}

// Keep keeps kernelID from the cull, as its user's "Keep it" does.
func (c *Client) Keep(ctx context.Context, kernelID string) (KeepReply, error) {
	var reply KeepReply
	err := c.do(ctx, http.MethodPost, "/api/v1/kernels/"+url.PathEscape(kernelID)+"/keep", nil, &reply)
	return reply, err
}
