// Command httpbench is the measuring side of scripts/measure-http.sh.
//
//	httpbench discard -listen ADDR    a plain net/http server that reads each
//	                                  request body into io.Discard (the baseline)
//	httpbench puts -url URL -n N -c C -size BYTES
//	                                  N puts of distinct random blobs, C at a
//	                                  time over keep-alive connections; prints
//	                                  puts per second
//	httpbench gets -url URL -n N -c C  N GETs of URL, C at a time
//
// -token T sends "Authorization: Bearer T" with every request.
package main

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: httpbench discard|puts|gets [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "discard: address")
	url := fs.String("url", "", "puts: the server's put URL")
	n := fs.Int("n", 10000, "puts: how many")
	c := fs.Int("c", 8, "puts: how many at a time")
	size := fs.Int("size", 1024, "puts: bytes per blob")
	token := fs.String("token", "", "bearer token to send")
	fs.Parse(os.Args[2:])
	switch os.Args[1] {
	case "discard":
		http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
		})
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("listening", ln.Addr())
		if err := http.Serve(ln, nil); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "puts":
		puts(*url, *n, *c, *size, *token)
	case "gets":
		gets(*url, *n, *c, *token)
	default:
		fmt.Fprintln(os.Stderr, "usage: httpbench discard|puts|gets [flags]")
		os.Exit(2)
	}
}

func puts(url string, n, c, size int, token string) {
	tr := &http.Transport{MaxIdleConnsPerHost: c}
	hc := &http.Client{Transport: tr}
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	salt := make([]byte, 16)
	rand.Read(salt)
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := make([]byte, size)
			copy(body, salt)
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				binary.LittleEndian.PutUint64(body[16:], uint64(i))
				req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/octet-stream")
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := hc.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	fmt.Printf("%d puts of %d B, %d at a time: %.2f s, %.0f puts/s, %d failed\n", n, size, c, el.Seconds(), float64(n)/el.Seconds(), failed.Load())
	if failed.Load() > 0 {
		os.Exit(1)
	}
}

func gets(url string, n, c int, token string) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c}}
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				req, _ := http.NewRequest("GET", url, nil)
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := hc.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	fmt.Printf("%d gets, %d at a time: %.2f s, %.0f gets/s, %d failed\n", n, c, el.Seconds(), float64(n)/el.Seconds(), failed.Load())
	if failed.Load() > 0 {
		os.Exit(1)
	}
}
