package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// halfClose sends c over a connection of its own as HTTP/1.1, shuts the
// connection's sending side (RFC 9112 allows it: the request is whole),
// and reads the answer to its end. The answer is judged as any other: a
// half-closed client is owed a whole 200 or an error in its API's shape,
// never an empty or cut answer that looks like a success.
func halfClose(addr string, c call) (verdict, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return verdict{}, err
	}
	defer conn.Close()
	// A paused replica answers once resumed; nothing should take this long.
	conn.SetDeadline(time.Now().Add(2 * time.Minute))
	var req bytes.Buffer
	fmt.Fprintf(&req, "POST %s HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\n", c.path, c.key)
	if c.api == apiMessages {
		req.WriteString("Anthropic-Version: 2023-06-01\r\n")
	}
	req.WriteString("Content-Length: " + strconv.Itoa(len(c.body)) + "\r\n\r\n")
	req.Write(c.body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		return verdict{}, err
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return verdict{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return verdict{}, fmt.Errorf("half-closed: no answer: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		// A body cut short of its length or its last chunk.
		if resp.StatusCode == http.StatusOK {
			return verdict{outcome: broken, reason: fmt.Sprintf("200 %s answer to a half-closed client cut: %v after %d bytes", c.api, err, len(body))}, nil
		}
		return verdict{outcome: unshaped, reason: fmt.Sprintf("%d answer to a half-closed client cut: %v", resp.StatusCode, err)}, nil
	}
	return judge(c.api, c.stream, resp.StatusCode, body), nil
}
