// Command result_oracle replays linkerd-cni's prevResult handling with the CNI library Debian
// ships (containernetworking/cni 1.1.2): one base64 JSON line {"version": V, "prev": {...}}
// in, one JSON string out: "PARSE <err>", "CONVERT <err>", "PRINT <err>" or "OK <stdout>".
// 1.1.2 differs from upstream's v1.3.0 only in the 1.x types and route extras (MTU etc.),
// which the Python side does not send here.
package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"

	cniv1 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

type request struct {
	Version string                 `json:"version"`
	Prev    map[string]interface{} `json:"prev"`
}

func replay(data []byte) string {
	req := request{}
	if err := json.Unmarshal(data, &req); err != nil {
		panic(err)
	}
	raw, _ := json.Marshal(req.Prev)
	res, err := version.NewResult(req.Version, raw)
	if err != nil {
		return "PARSE " + err.Error()
	}
	prev, err := cniv1.NewResultFromResult(res)
	if err != nil {
		return "CONVERT " + err.Error()
	}
	out, err := prev.GetAsVersion(req.Version)
	if err != nil {
		return "PRINT " + err.Error()
	}
	var buf bytes.Buffer
	if err := out.PrintTo(&buf); err != nil {
		return "PRINT " + err.Error()
	}
	return "OK " + buf.String()
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	for in.Scan() {
		data, err := base64.StdEncoding.DecodeString(in.Text())
		if err != nil {
			panic(err)
		}
		line, _ := json.Marshal(replay(data))
		fmt.Println(string(line))
	}
}
