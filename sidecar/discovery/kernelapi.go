package discovery

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// ShutdownKernel asks the server to shut its kernel down (DELETE
// /api/kernels/{id}), as its own idle culler does: the server's state stays
// right and the kernel's process group goes the usual way.
func (s Server) ShutdownKernel(ctx context.Context, hc *http.Client, kernelID string) error {
	if s.URL == "" {
		return fmt.Errorf("kernel %s: no server to ask", kernelID)
	}
	target, hc, err := s.requestTarget(hc)
	if err != nil {
		return fmt.Errorf("server %s (%s): %w", s.URL, s.File, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, target+"api/kernels/"+url.PathEscape(kernelID), nil)
	if err != nil {
		return err
	}
	if s.Token != "" {
		req.Header.Set("Authorization", "token "+s.Token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("shutting down kernel %s: %w", kernelID, s.requestError(err))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("server %s: shutting down kernel %s: %s", s.URL, kernelID, resp.Status)
	}
	return nil
}
