// Two GETs with Go's net/http client (default transport: keep-alive, no redirects
// followed) against the URL in os.Args[1]; one JSON line per request: the status and
// body, or the error (tests/tools/test_http_framing_oracle.py).
package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"time"
)

type outcome struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
	Err    string `json:"err"`
}

func main() {
	client := &http.Client{
		Timeout: 3 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	out := json.NewEncoder(os.Stdout)
	for i := 0; i < 2; i++ {
		var o outcome
		resp, err := client.Get(os.Args[1])
		if err == nil {
			var body []byte
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			o.Status, o.Body = resp.StatusCode, string(body)
		}
		if err != nil {
			o.Err = err.Error()
		}
		out.Encode(o)
		time.Sleep(50 * time.Millisecond) // the transport's read loop sees what came after
	}
}
