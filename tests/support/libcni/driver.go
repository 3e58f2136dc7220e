// Command driver runs a CNI network list through the real libcni, as containerd and CRI-O do.
//
//	driver add|check|del CONFLIST
//
// Environment: DRIVER_PLUGIN_DIR (plugin search path), DRIVER_NETNS, DRIVER_CONTAINERID,
// DRIVER_IFNAME (default eth0), DRIVER_CACHE_DIR (libcni's result cache), CNI_ARGS (K=V;K=V,
// handed to every plugin). ADD prints the final result as JSON on stdout; any error is
// printed on stderr and exits 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

func pluginArgs(raw string) [][2]string {
	var out [][2]string
	for _, pair := range strings.Split(raw, ";") {
		if kv := strings.SplitN(pair, "=", 2); len(kv) == 2 {
			out = append(out, [2]string{kv[0], kv[1]})
		}
	}
	return out
}

func run(cmd, path string) error {
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		return err
	}
	ifname := os.Getenv("DRIVER_IFNAME")
	if ifname == "" {
		ifname = "eth0"
	}
	rt := &libcni.RuntimeConf{
		ContainerID: os.Getenv("DRIVER_CONTAINERID"),
		NetNS:       os.Getenv("DRIVER_NETNS"),
		IfName:      ifname,
		Args:        pluginArgs(os.Getenv("CNI_ARGS")),
		CacheDir:    os.Getenv("DRIVER_CACHE_DIR"),
	}
	os.Unsetenv("CNI_ARGS") // libcni builds CNI_ARGS from rt.Args
	cni := libcni.NewCNIConfigWithCacheDir(
		strings.Split(os.Getenv("DRIVER_PLUGIN_DIR"), ":"), rt.CacheDir, nil)
	ctx := context.Background()
	switch cmd {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		data, err := json.Marshal(result)
		if err != nil {
			return err
		}
		fmt.Println(string(data))
		return nil
	case "check":
		return cni.CheckNetworkList(ctx, list, rt)
	case "del":
		return cni.DelNetworkList(ctx, list, rt)
	}
	return fmt.Errorf("unknown command %q", cmd)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: driver add|check|del CONFLIST")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, err.Error())
		os.Exit(1)
	}
}
