package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// cluster is a NATS cluster of real nats-server nodes hosted in this
// process, as natsbus hosts its embedded server (the nats-server library),
// joined into a full mesh by their route connections over loopback TCP.
type cluster struct {
	srvs  []*server.Server
	links []*link // with cuttable: every route, dialled through a proxy (routecut.go)
	store string  // the nodes' JetStream directories ("": no JetStream)
	// urls is the client address list every simulated process is given,
	// as a deployment gives NATS_SERVER: the client spreads over the nodes.
	urls string
}

// startCluster starts n nodes and waits until each has a route to every
// other one; with js, JetStream (discovery's stream) runs on every node;
// with cuttable, every route goes through a proxy, so that crash can lose
// a node abruptly (the proxies cost a copy of every message between nodes).
func startCluster(n int, js, cuttable bool) (*cluster, error) {
	c := &cluster{}
	if js {
		dir, err := os.MkdirTemp("", "scalesim-js-")
		if err != nil {
			return nil, err
		}
		c.store = dir
	}
	// Every node is given the route ports of all the others up front: with
	// JetStream a node is ready only once the cluster has elected its
	// meta leader, so they must start together.
	cports := make([]int, n)
	for i := range cports {
		p, err := freePort()
		if err != nil {
			c.shutdown()
			return nil, err
		}
		cports[i] = p
	}
	var clientURLs []string
	for i := range n {
		var routes []*url.URL
		for j, p := range cports {
			if j == i {
				continue
			}
			host := "127.0.0.1:" + strconv.Itoa(p)
			if cuttable {
				k, err := newLink(i, j, host)
				if err != nil {
					c.shutdown()
					return nil, err
				}
				c.links = append(c.links, k)
				host = k.addr()
			}
			routes = append(routes, &url.URL{Scheme: "nats", Host: host})
		}
		opts := &server.Options{
			ServerName: fmt.Sprintf("scalesim-%d", i),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			// As the embedded server: no logger (nothing on stdout or
			// stderr), no signal handlers, natsbus's payload limit.
			NoLog:      true,
			NoSigs:     true,
			MaxPayload: 8 << 20,
			// Without a system account the servers publish no events of
			// their own: every message counted is the simulation's.
			NoSystemAccount: true,
			Cluster: server.ClusterOpts{
				Name: "scalesim",
				Host: "127.0.0.1",
				Port: cports[i],
				// The nodes dial only the routes given (through the
				// proxies when cuttable), never the addresses that peers
				// would otherwise gossip.
				NoAdvertise: cuttable,
			},
			Routes: routes,
		}
		if js {
			// JetStream in a cluster needs the system account (its
			// internal traffic stays there: no client subscription of the
			// simulation's counts it).
			opts.NoSystemAccount = false
			opts.JetStream = true
			opts.StoreDir = filepath.Join(c.store, strconv.Itoa(i))
		}
		srv, err := server.NewServer(opts)
		if err != nil {
			c.shutdown()
			return nil, err
		}
		srv.Start()
		c.srvs = append(c.srvs, srv)
	}
	for i, srv := range c.srvs {
		if !srv.ReadyForConnections(30 * time.Second) {
			c.shutdown()
			return nil, fmt.Errorf("nats-server %d not ready", i)
		}
		clientURLs = append(clientURLs, "nats://"+srv.Addr().String())
	}
	c.urls = strings.Join(clientURLs, ",")
	deadline := time.Now().Add(10 * time.Second)
	for _, srv := range c.srvs {
		for srv.NumRemotes() < n-1 {
			if time.Now().After(deadline) {
				c.shutdown()
				return nil, errors.New("the cluster's routes did not form")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return c, nil
}

// crash loses node i as a crash does: its routes are cut first, so it
// hands nothing over to its peers, then it stops (its clients' connections
// close, and they move to the other nodes). Without cuttable routes it is
// a graceful shutdown.
func (c *cluster) crash(i int) {
	for _, k := range c.links {
		if k.from == i || k.to == i {
			k.close()
		}
	}
	c.srvs[i].Shutdown()
}

func (c *cluster) shutdown() {
	for _, srv := range c.srvs {
		srv.Shutdown()
	}
	for _, k := range c.links {
		k.close()
	}
	for _, srv := range c.srvs {
		srv.WaitForShutdown()
	}
	if c.store != "" {
		_ = os.RemoveAll(c.store)
	}
}

// counts are what the cluster carried, summed over its nodes. Deliveries
// are read from the servers' count of messages per subscription, client
// and route subscriptions apart, and sorted by the subject subscribed to:
// exact at any load, unlike totals in which the discovery traffic would
// have to be estimated and taken out. Publishes and bytes come from the
// servers' totals.
type counts struct {
	inClient, inClientB int64 // messages (and payload bytes) published by clients

	announcements int64 // announcements published: the meter's deliveries (see meter)
	annDeliv      int64 // announcements delivered to clients, the meter aside
	annRoute      int64 // announcements forwarded to other nodes
	reqDeliv      int64 // request envelopes delivered (dc.req.*)
	reqRoute      int64
	replyDeliv    int64 // replies delivered to inboxes: acknowledgements, query answers
	replyRoute    int64
	abortDeliv    int64 // abort confirmations delivered (dc.aborted and its callers' subjects)
	abortRoute    int64
	otherDeliv    int64 // anything else
	otherRoute    int64
}

// deliv is every message delivered to a client, the meter aside; route
// every message forwarded between nodes that a subscription counted.
func (c counts) deliv() int64 {
	return c.annDeliv + c.reqDeliv + c.replyDeliv + c.abortDeliv + c.otherDeliv
}

func (c counts) route() int64 {
	return c.annRoute + c.reqRoute + c.replyRoute + c.abortRoute + c.otherRoute
}

func (c counts) minus(o counts) counts {
	return counts{
		inClient: c.inClient - o.inClient, inClientB: c.inClientB - o.inClientB,
		announcements: c.announcements - o.announcements,
		annDeliv:      c.annDeliv - o.annDeliv, annRoute: c.annRoute - o.annRoute,
		reqDeliv: c.reqDeliv - o.reqDeliv, reqRoute: c.reqRoute - o.reqRoute,
		replyDeliv: c.replyDeliv - o.replyDeliv, replyRoute: c.replyRoute - o.replyRoute,
		abortDeliv: c.abortDeliv - o.abortDeliv, abortRoute: c.abortRoute - o.abortRoute,
		otherDeliv: c.otherDeliv - o.otherDeliv, otherRoute: c.otherRoute - o.otherRoute,
	}
}

// Subject prefixes of the plane (docs/request-plane.md sections 4 and 5);
// discovery keeps the first two unexported.
const (
	annPrefix   = "dc.inst."
	reqPrefix   = "dc.req."
	inboxPrefix = "_INBOX."
)

// add counts the messages delivered to one subscription.
func (c *counts) add(subject string, n int64, route, meter bool) {
	pick := func(deliv, rt *int64) {
		if route {
			*rt += n
		} else {
			*deliv += n
		}
	}
	switch {
	case meter && strings.HasPrefix(subject, annPrefix):
		c.announcements += n
	case meter:
	case strings.HasPrefix(subject, annPrefix):
		pick(&c.annDeliv, &c.annRoute)
	case strings.HasPrefix(subject, reqPrefix):
		pick(&c.reqDeliv, &c.reqRoute)
	case strings.HasPrefix(subject, inboxPrefix):
		pick(&c.replyDeliv, &c.replyRoute)
	case strings.HasPrefix(subject, plane.AbortedSubject):
		pick(&c.abortDeliv, &c.abortRoute)
	default:
		pick(&c.otherDeliv, &c.otherRoute)
	}
}

func (c *cluster) counts() (counts, error) {
	var t counts
	for _, srv := range c.srvs {
		v, err := srv.Varz(nil)
		if err != nil {
			return t, err
		}
		t.inClient += v.InClientMsgs
		t.inClientB += v.InClientBytes
		cz, err := srv.Connz(&server.ConnzOptions{SubscriptionsDetail: true, Limit: 1 << 30})
		if err != nil {
			return t, err
		}
		for _, ci := range cz.Conns {
			for _, sd := range ci.SubsDetail {
				t.add(sd.Subject, sd.Msgs, false, ci.Name == meterName)
			}
		}
		rz, err := srv.Routez(&server.RoutezOptions{SubscriptionsDetail: true})
		if err != nil {
			return t, err
		}
		for _, ri := range rz.Routes {
			for _, sd := range ri.SubsDetail {
				t.add(sd.Subject, sd.Msgs, true, false)
			}
		}
	}
	return t, nil
}

// conns reports, per node, its client connections and its route
// connections (nats-server keeps a pool of several per peer).
func (c *cluster) conns() (clients, routes []int) {
	for _, srv := range c.srvs {
		clients = append(clients, srv.NumClients())
		routes = append(routes, srv.NumRoutes())
	}
	return clients, routes
}

// meter is one more subscriber of every announcement: the number of
// messages the servers deliver to it is the number of announcements
// published (see counts).
type meter struct{ nc *nats.Conn }

const meterName = "scalesim-meter"

func newMeter(urls string) (*meter, error) {
	nc, err := nats.Connect(urls, nats.Name(meterName))
	if err != nil {
		return nil, err
	}
	if _, err := nc.Subscribe(annPrefix+">", func(*nats.Msg) {}); err != nil {
		nc.Close()
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, err
	}
	return &meter{nc: nc}, nil
}

func (m *meter) close() { m.nc.Close() }
