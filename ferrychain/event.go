package ferrychain

import (
	"encoding/binary"
	"encoding/json"
	"strconv"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferryevent"
)

// logNamespace derives event IDs from log identities.
var logNamespace = uuid.MustParse("6a1f4e2c-8d3b-4b7a-9c5e-2f8d1a0b3c4e")

// LogID is the event ID of a log: derived from its identity (chain ID,
// block hash, log index), so that every delivery of one log has one ID and
// a log re-mined into another block (another hash or index) has another.
func LogID(chainID uint64, blockHash common.Hash, logIndex uint) uuid.UUID {
	return logID(chainID, blockHash, logIndex, 0)
}

// logID adds the block's incarnation: how often a reorg orphaned it
// before it became canonical again (its earlier events stay RETRACTED).
func logID(chainID uint64, blockHash common.Hash, logIndex uint, incarnation uint32) uuid.UUID {
	b := make([]byte, 8+32+8, 8+32+8+4)
	binary.BigEndian.PutUint64(b[:8], chainID)
	copy(b[8:40], blockHash[:])
	binary.BigEndian.PutUint64(b[40:], uint64(logIndex))
	if incarnation > 0 {
		b = binary.BigEndian.AppendUint32(b, incarnation)
	}
	return uuid.NewSHA1(logNamespace, b)
}

// LogPayload is an event's payload (JSON): where the log is and what it
// says.
type LogPayload struct {
	ChainID     uint64         `json:"chainId"`
	BlockNumber uint64         `json:"blockNumber"`
	BlockHash   common.Hash    `json:"blockHash"`
	TxHash      common.Hash    `json:"txHash"`
	TxIndex     uint           `json:"txIndex"`
	LogIndex    uint           `json:"logIndex"`
	Address     common.Address `json:"address"`
	Topics      []common.Hash  `json:"topics"`
	Data        hexutil.Bytes  `json:"data"`
}

// Headers carried by every chain event, for filtering without decoding.
const (
	HeaderChainID     = "chain-id"
	HeaderBlockNumber = "block-number"
	HeaderBlockHash   = "block-hash"
	HeaderTxHash      = "tx-hash"
	HeaderLogIndex    = "log-index"
)

// event turns a log into an event. Key is the contract address (a
// contract's logs stay in chain order); Type is the ABI event name, or the
// first topic.
func (s *Source) event(l *types.Log, blockTime uint64, incarnation uint32) *ferryevent.Event {
	p := LogPayload{ChainID: s.chainID, BlockNumber: l.BlockNumber, BlockHash: l.BlockHash, TxHash: l.TxHash, TxIndex: l.TxIndex,
		LogIndex: l.Index, Address: l.Address, Topics: l.Topics, Data: l.Data}
	body, _ := json.Marshal(p) // fixed types: cannot fail
	typ := "anonymous"
	if len(l.Topics) > 0 {
		typ = l.Topics[0].Hex()
		if s.cfg.ABI != nil {
			if ev, err := s.cfg.ABI.EventByID(l.Topics[0]); err == nil {
				typ = ev.Name
			}
		}
	}
	return &ferryevent.Event{
		ID:          logID(s.chainID, l.BlockHash, l.Index, incarnation),
		Topic:       s.cfg.Topic,
		Key:         l.Address.Hex(),
		Type:        typ,
		Source:      "chain/" + strconv.FormatUint(s.chainID, 10),
		ContentType: "application/json",
		Payload:     body,
		CreatedAt:   time.Unix(int64(blockTime), 0).UTC(),
		Headers: map[string]string{
			HeaderChainID:     strconv.FormatUint(s.chainID, 10),
			HeaderBlockNumber: strconv.FormatUint(l.BlockNumber, 10),
			HeaderBlockHash:   l.BlockHash.Hex(),
			HeaderTxHash:      l.TxHash.Hex(),
			HeaderLogIndex:    strconv.FormatUint(uint64(l.Index), 10),
		},
	}
}

// DecodeLog reads a chain event's payload.
func DecodeLog(ev *ferryevent.Event) (*LogPayload, error) {
	var p LogPayload
	if err := json.Unmarshal(ev.Payload, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
