// Command gojson_oracle decodes documents with Go's encoding/json into a struct shaped like
// upstream linkerd-cni's PluginConf, one base64 document per input line; it prints one JSON
// string per line: "ERR <error>" or "OK <the struct marshalled back>".
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
)

type ProxyInit struct {
	IncomingProxyPort     int      `json:"incoming-proxy-port"`
	OutgoingProxyPort     int      `json:"outgoing-proxy-port"`
	ProxyUID              int      `json:"proxy-uid"`
	ProxyGID              int      `json:"proxy-gid"`
	PortsToRedirect       []int    `json:"ports-to-redirect"`
	InboundPortsToIgnore  []string `json:"inbound-ports-to-ignore"`
	OutboundPortsToIgnore []string `json:"outbound-ports-to-ignore"`
	SubnetsToIgnore       []string `json:"subnets-to-ignore"`
	Simulate              bool     `json:"simulate"`
	UseWaitFlag           bool     `json:"use-wait-flag"`
	IPTablesMode          string   `json:"iptables-mode"`
	IPv6                  bool     `json:"ipv6"`
}

type Kubernetes struct {
	K8sAPIRoot string `json:"k8s_api_root"`
	Kubeconfig string `json:"kubeconfig"`
}

type PluginConf struct {
	CNIVersion    string                  `json:"cniVersion,omitempty"`
	Name          string                  `json:"name,omitempty"`
	Type          string                  `json:"type,omitempty"`
	RawPrevResult *map[string]interface{} `json:"prevResult"`
	LogLevel      string                  `json:"log_level"`
	ProxyInit     ProxyInit               `json:"linkerd"`
	Kubernetes    Kubernetes              `json:"kubernetes"`
}

func decode(data []byte) string {
	conf := PluginConf{}
	if err := json.Unmarshal(data, &conf); err != nil {
		return "ERR " + err.Error()
	}
	out, _ := json.Marshal(conf)
	return "OK " + string(out)
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	for in.Scan() {
		data, err := base64.StdEncoding.DecodeString(in.Text())
		if err != nil {
			panic(err)
		}
		line, _ := json.Marshal(decode(data))
		fmt.Println(string(line))
	}
}
