"""tcp_info through exact inet_diag lookups agrees with what the sockets really did."""

from __future__ import annotations

import os
import socket

from tensorlights.discovery.sockdiag import SockDiag


def test_tcp_info_counts_the_bytes_the_peer_acknowledged() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            payload = b"x" * 300_000
            peer.sendall(payload)
            got = 0
            while got < len(payload):
                got += len(client.recv(1 << 20))
            diag = SockDiag()
            try:
                inode = os.fstat(peer.fileno()).st_ino
                (sock,) = diag.tcp_sockets({inode})
                deadline = 50
                while deadline:  # the final ACK may still be on its way
                    (info,) = diag.tcp_info([(sock.family, sock.sockid)])
                    assert info is not None
                    if info.unacked == 0:
                        break
                    deadline -= 1
                assert info is not None
                assert info.bytes_acked == len(payload)
                assert info.bytes_sent >= len(payload) and info.notsent_bytes == 0
                # Retransmissions are counted apart: all acknowledged, nothing outstanding.
                assert info.bytes_sent - info.bytes_retrans == len(payload)
                assert info.outstanding == 0
                assert info.rtt_us > 0 and info.last_ack_recv_ms < 10_000
                assert info.data_segs_out >= 1
            finally:
                diag.close()
    gone = SockDiag()
    try:
        assert gone.tcp_info([(sock.family, sock.sockid)]) == [None]  # closed: no answer
    finally:
        gone.close()
