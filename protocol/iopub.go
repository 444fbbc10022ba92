package protocol

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// maxTopicBytes bounds the iopub topics we look at: kernel.<uuid>.status.
const maxTopicBytes = 256

// readIOPub reads the kernel's status messages until the generation
// fails (any of its sockets, or Close), which closes iopub.
func (c *Client) readIOPub(g *generation) {
	narrowed := false
	var work shellWork // this generation's: what the last one saw is gone
	for {
		zm, err := g.iopub.RecvMsg()
		if err != nil {
			g.fail(fmt.Errorf("iopub channel: %w", err))
			return
		}
		if zm.Type == zmq4.CmdMsg {
			continue // a ZMTP command (PING is answered by RecvMsg)
		}
		if len(zm.Frames) == 0 || !isStatusTopic(zm.Frames[0]) {
			// Only possible before the subscription is narrowed.
			c.iopubOther.Add(1)
			continue
		}
		msg, err := Decode(zm.Frames, g.key, c.limits)
		if err == nil && msg.Header.MsgType == "iopub_welcome" {
			// ipykernel >= 7's XPUB greets every new subscription (JEP 65),
			// on the subscribed topic: ours is a status topic.
			c.iopubOther.Add(1)
			continue
		}
		if err != nil || msg.Header.MsgType != "status" {
			c.decodeErrors.Add(1)
			continue
		}
		if state, ok := executionState(msg.Content); ok {
			if work.status(msg.Parent, state) {
				c.shellWorkAt.Store(time.Now().UnixNano())
			}
			if now := work.state(); now != "" {
				c.execState.Store(&now)
			}
		}
		if !narrowed {
			narrowed = true
			topic := string(zm.Frames[0])
			if err := subscribe(g.iopub, true, topic); err != nil {
				g.fail(fmt.Errorf("iopub subscribe %s: %w", topic, err))
				return
			}
			if err := subscribe(g.iopub, false, "kernel."); err != nil {
				g.fail(fmt.Errorf("iopub unsubscribe: %w", err))
				return
			}
		}
	}
}

// subscribe sends a SUB socket's (un)subscription, as ZMTP 3.0 has it: a
// message whose first byte is 1 to subscribe and 0 to unsubscribe.
func subscribe(conn *zmq4.Conn, on bool, topic string) error {
	flag := byte(0)
	if on {
		flag = 1
	}
	return conn.SendMsg(zmq4.NewMsg(append([]byte{flag}, topic...)))
}

func isStatusTopic(t []byte) bool {
	const prefix, suffix = "kernel.", ".status"
	return len(t) <= maxTopicBytes && len(t) > len(prefix)+len(suffix) &&
		string(t[:len(prefix)]) == prefix && string(t[len(t)-len(suffix):]) == suffix
}

func executionState(content json.RawMessage) (string, bool) {
	var st struct {
		ExecutionState string `json:"execution_state"`
	}
	if err := json.Unmarshal(content, &st); err != nil || st.ExecutionState == "" {
		return "", false
	}
	return st.ExecutionState, true
}
