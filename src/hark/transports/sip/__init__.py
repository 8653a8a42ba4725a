"""SIP: a sans-I/O SIP stack (messages, transactions, dialogs), its transports and RTP media."""
