package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/chromedp/chromedp"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/eth/ethconfig"
	"github.com/ethereum/go-ethereum/ethclient/simulated"
	"github.com/ethereum/go-ethereum/node"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
)

// freePort returns a port nothing listens on now.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// TestChainRunAndStatus runs `ferry chain run` against a simulated chain
// served over WebSocket, then `ferry chain status --json`: the group's
// inbox holds one event per log, the cursor is at the head, and /metrics
// counts the logs both as the source's (ferry_chain_ingested_events_total)
// and as the inbox's deliveries from system "evm"
// (ferry_consumer_ingested_events_total).
func TestChainRunAndStatus(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	key, err := crypto.GenerateKey()
	require.NoError(t, err)
	contract := common.HexToAddress("0x00000000000000000000000000000000000c0de0")
	topic := crypto.Keccak256Hash([]byte("Noted(bytes)"))
	code := append(append([]byte{0x36, 0x60, 0x00, 0x60, 0x00, 0x37, 0x7f}, topic.Bytes()...), 0x36, 0x60, 0x00, 0xa1, 0x00)
	backend := simulated.NewBackend(types.GenesisAlloc{
		crypto.PubkeyToAddress(key.PublicKey): {Balance: new(big.Int).Mul(big.NewInt(1e18), big.NewInt(100))},
		contract:                              {Code: code},
	}, func(n *node.Config, _ *ethconfig.Config) {
		n.WSHost, n.WSPort, n.WSModules, n.WSOrigins = "127.0.0.1", port, []string{"eth"}, []string{"*"}
	})
	defer backend.Close()

	schema := ferrypgtest.Schema(t)
	db := []string{"--database-url", ferrypgtest.URL(), "--schema", schema}
	args := append([]string{"chain", "run", "--rpc-url", fmt.Sprintf("ws://127.0.0.1:%d", port), "--group", "indexer",
		"--contracts", contract.Hex(), "--poll-interval", "50ms", "--metrics-addr", metricsAddr}, db...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() { done <- run(ctx, args, &bytes.Buffer{}, &stderr) }()

	for i := range 5 {
		tx := types.MustSignNewTx(key, types.LatestSignerForChainID(big.NewInt(1337)), &types.DynamicFeeTx{
			ChainID: big.NewInt(1337), Nonce: uint64(i), GasTipCap: big.NewInt(1e9), GasFeeCap: big.NewInt(100e9), Gas: 100000,
			To: &contract, Data: []byte(fmt.Sprintf("note %d", i)),
		})
		require.NoError(t, backend.Client().SendTransaction(context.Background(), tx))
		backend.Commit()
	}
	head, err := backend.Client().BlockNumber(context.Background())
	require.NoError(t, err)
	var status struct {
		Block  uint64 `json:"block"`
		Head   uint64 `json:"head"`
		Reorgs uint64 `json:"reorgs"`
		Tier   string `json:"tier"`
	}
	require.Eventually(t, func() bool {
		var out bytes.Buffer
		code := run(context.Background(), append([]string{"chain", "status", "--group", "indexer", "--json", "--rpc-url", fmt.Sprintf("ws://127.0.0.1:%d", port)}, db...), &out, &bytes.Buffer{})
		return code == 0 && json.Unmarshal(out.Bytes(), &status) == nil && status.Block == head
	}, 30*time.Second, 100*time.Millisecond, "chain run log: %s", &stderr)
	require.Equal(t, head, status.Head)
	require.Equal(t, "latest", status.Tier)
	want := []string{
		`ferry_chain_ingested_events_total{group="indexer"} 5`,
		`ferry_consumer_ingested_events_total{group="indexer",result="inserted",system="evm"} 5`,
	}
	scrape := func() string {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	var served string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		served = scrape()
		if !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(served, w) }) || time.Now().After(deadline) {
			break
		}
	}
	var ours []string
	for _, line := range strings.Split(served, "\n") {
		if strings.HasPrefix(line, "ferry_") {
			ours = append(ours, line)
		}
	}
	for _, w := range want {
		require.True(t, strings.Contains(served, w), "/metrics of ferry chain run has no %s; its ferry_ series:\n%s", w, strings.Join(ours, "\n"))
	}

	// The console shows the source's cursor, and its lag from the node's head.
	console := startConsole(t, "chain-token", append([]string{"--chain-groups", "indexer", "--rpc-url", fmt.Sprintf("ws://127.0.0.1:%d", port)}, db...)...)
	req, err := http.NewRequest(http.MethodGet, console+"api/v1/chains", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer chain-token")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var chains struct{ Chains []uiapi.ChainJSON }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&chains))
	resp.Body.Close()
	require.Len(t, chains.Chains, 1)
	c := chains.Chains[0]
	require.Equal(t, "chain/indexer", c.Name)
	require.Equal(t, "latest", c.Tier)
	require.Equal(t, head, c.Block)
	require.NotNil(t, c.Head, "the head, from --rpc-url: %s", c.HeadError)
	require.Equal(t, head, *c.Head)
	require.EqualValues(t, 0, *c.LagBlocks)
	require.True(t, c.Held, "chain run leads it")

	// And on the console's overview, in a browser: the source's card.
	bctx, bcancel := context.WithTimeout(browser(t), time.Minute)
	defer bcancel()
	card := `#chains [data-chain="chain/indexer"]`
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(console+"#token=chain-token"), chromedp.WaitVisible(chromedp.CSS(card))), "the overview shows the chain source's card")
	shown, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(card)))
	require.NoError(t, err)
	for _, want := range []string{"chain/indexer", "led", fmt.Sprintf("%d\nlast block ingested", head), "0\nblocks behind the head", "latest\ntier"} {
		require.Regexp(t, strings.ReplaceAll(want, "\n", `\s*`), shown, "the card: %q", shown)
	}
	cancel()
	require.Equal(t, 0, <-done, "chain run exits cleanly on SIGTERM: %s", &stderr)

	var n int
	require.NoError(t, ferrypgtest.Pool(t).QueryRow(context.Background(),
		`SELECT count(*) FROM `+schema+`.inbox WHERE group_name = 'indexer' AND state = $1`, string(ferrydriver.InboxPending)).Scan(&n))
	require.Equal(t, 5, n, "one inbox event per log, waiting for the group's handlers")
}
