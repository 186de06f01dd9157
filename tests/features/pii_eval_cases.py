"""Labelled sentences for the PII scanners' precision and recall (see docs/pii.md).

Each case is (text, [(type, value), ...]) and lists every piece of personal information a
careful human reader would mark in the text, whether or not the scanners find it: some
labels are deliberate misses (formats the rules do not cover), and the hard negatives mimic
real PII without being any. All numbers are invented; checksummed ones were computed to be
valid (or, in the negatives, invalid) on purpose.
"""

from __future__ import annotations

E = "email"
NANP = "phone_nanp"
INTL = "phone_intl"
CARD = "payment_card"
SSN = "us_ssn"
NINO = "uk_nino"
SIN = "ca_sin"
IBAN = "iban"
IP4 = "ipv4"
IP6 = "ipv6"
MAC = "mac_address"
ADDR = "street_address"
DOB = "date_of_birth"
URL = "url_credentials"
AWS = "aws_access_key"
KEY = "private_key"
JWT = "jwt"
BTC = "bitcoin_address"
VIN = "vin"
PASS = "passport_number"
NAME = "person_name"

_JWT1 = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkphbmUgUm9lIiwia"
    "WF0IjoxNTE2MjM5MDIyfQ.ntRJ2HrgURWwL9CedeXxoFvN1noD0hozzDWgb4KbdOM"
)
_JWT2 = (
    "eyJhbGciOiJSUzI1NiIsImtpZCI6ImsxIn0.eyJzdWIiOiJ1LTQyIiwiZXhwIjoxNzAwMDAwMDAwfQ."
    "EQIPRj89fhW-UZGMPJxqCGSMrFbEAZ0lGmzcaGoGCNk"
)
_JWT3 = (
    "eyJ0eXAiOiJKV1QiLCJhbGciOiJFUzI1NiJ9.eyJlbWFpbCI6ImFAYi5jbyJ9."
    "Yct1lsFJsTxgpgw_yKuXzfNZ-anXBQRrjksu-XQ7s3k"
)
_JWT_NONE = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."
_JWT_NOALG = "eyJ0eXAiOiJKV1QifQ.eyJzdWIiOiJuby1hbGcifQ.ILj7i-_syXpQo4LxDHHpr3QvToe6tPiJXmnRLHo2Yi4"

CASES: list[tuple[str, list[tuple[str, str]]]] = [
    # ------------------------------------------------------------------ email
    (
        "Please send the signed form to jane.doe@example.com by Friday.",
        [(E, "jane.doe@example.com")],
    ),
    (
        "Questions? Write to support+billing@shop-online.co.uk and we will reply within a day.",
        [(E, "support+billing@shop-online.co.uk")],
    ),
    (
        "My work address is r.kowalski@uni-heidelberg.de, my private one is rkowal77@gmail.com.",
        [(E, "r.kowalski@uni-heidelberg.de"), (E, "rkowal77@gmail.com")],
    ),
    ("Contact: info@acme-widgets.net", [(E, "info@acme-widgets.net")]),
    (
        "Security reports go to dev_team@mail.example.org, not to the public tracker.",
        [(E, "dev_team@mail.example.org")],
    ),
    ("CC: TOM.HARRIS@EXAMPLE.COM", [(E, "TOM.HARRIS@EXAMPLE.COM")]),
    ("Email me (lena_92@yahoo.fr) if the link is broken.", [(E, "lena_92@yahoo.fr")]),
    (
        '<a href="mailto:press@newsroom.example.com">Press office</a>',
        [(E, "press@newsroom.example.com")],
    ),
    (
        "Send CVs to hr.department@company.io before the end of the month.",
        [(E, "hr.department@company.io")],
    ),
    (
        "Her handle is @wanderer but her address is wanderer.k@protonmail.com.",
        [(E, "wanderer.k@protonmail.com")],
    ),
    (
        "Contact Mary Johnson at mary.johnson@example.com for the minutes.",
        [(NAME, "Mary Johnson"), (E, "mary.johnson@example.com")],
    ),
    (
        "write to jdoe at example dot com (spelled out to fool scrapers)",
        [(E, "jdoe at example dot com")],
    ),
    # hard negatives
    ("The logo is logo@2x.png and the retina icon is icon@3x.jpg.", []),
    ("Follow us @ExampleNews for breaking stories.", []),
    ("Use the format user@domain when you sign in to the VPN.", []),
    ("Pin requests@2.31.0 and urllib3@1.26.18 in the lock file.", []),
    ("Apples cost 3 @ $2 each at the market.", []),
    ("git clone git@github.com:acme/tools.git", []),
    # ------------------------------------------------------------------ phone_nanp
    ("Call our office at (212) 555-0147 between 9 and 5.", [(NANP, "(212) 555-0147")]),
    ("For reservations dial 415-555-0199.", [(NANP, "415-555-0199")]),
    ("Text STOP to 312.555.0123 to unsubscribe.", [(NANP, "312.555.0123")]),
    (
        "You can reach John Miller on +1 646 555 0182 after lunch.",
        [(NAME, "John Miller"), (NANP, "+1 646 555 0182")],
    ),
    ("Toll-free: 1-800-555-0100", [(NANP, "1-800-555-0100")]),
    (
        "Fax (617)555-0170 or phone (617) 555-0171.",
        [(NANP, "(617)555-0170"), (NANP, "(617) 555-0171")],
    ),
    ("Mobile: 778-555-0134 (Vancouver).", [(NANP, "778-555-0134")]),
    ("Her cell number is 305 555 0111.", [(NANP, "305 555 0111")]),
    ("Emergency contact: +1 (512) 555-0166.", [(NANP, "+1 (512) 555-0166")]),
    ("Call 1 416 555 0123 for the Toronto office.", [(NANP, "1 416 555 0123")]),
    ("or just text me at 2125550147 tonight", [(NANP, "2125550147")]),
    ("Phone: 212-555-0147 ext. 22", [(NANP, "212-555-0147")]),
    # hard negatives
    ("Order number 123-456-7890 has shipped.", []),
    ("The ISBN 978-0-306-40615-7 identifies the book.", []),
    ("Serial 555-123-4567 is printed under the battery.", []),
    ("Ticket 415-055-0199 was closed yesterday.", []),
    ("The census counted 212,555,014 people.", []),
    ("Build 2023.555.0147 fixed the crash.", []),
    # ------------------------------------------------------------------ phone_intl
    ("Our London office: +44 20 7946 0958.", [(INTL, "+44 20 7946 0958")]),
    ("Ring the hotel on +33 1 42 68 53 00 for late check-in.", [(INTL, "+33 1 42 68 53 00")]),
    ("WhatsApp me at +49 151 23456789.", [(INTL, "+49 151 23456789")]),
    ("Support (Germany): +49 (0)30 901820", [(INTL, "+49 (0)30 901820")]),
    ("Call +81 3-1234-5678 in Tokyo.", [(INTL, "+81 3-1234-5678")]),
    ("Contact +91 98765 43210 for the Mumbai team.", [(INTL, "+91 98765 43210")]),
    ("Phone: +61 2 9374 4000", [(INTL, "+61 2 9374 4000")]),
    ("+34 912 345 678 is the Madrid number.", [(INTL, "+34 912 345 678")]),
    ("Dial +353 1 234 5678 from abroad.", [(INTL, "+353 1 234 5678")]),
    ("Our Nairobi desk is +254 20 2710000.", [(INTL, "+254 20 2710000")]),
    ("Cape Town: +27.21.555.1234", [(INTL, "+27.21.555.1234")]),
    (
        "In London ring 020 7946 0958; in Paris 01 42 68 53 00.",
        [(INTL, "020 7946 0958"), (INTL, "01 42 68 53 00")],
    ),
    # hard negatives
    ("Temperatures rose by +12 degrees overnight.", []),
    ("The equation 3 +4 = 7 is wrong.", []),
    ("Add +100 500 points to the score.", []),
    ("Growth was +2.5% in 2023.", []),
    ("C++ 20 added modules.", []),
    ("Scores: +3, +12 and +7 after the bonus.", []),
    # ------------------------------------------------------------------ payment_card
    ("Charge it to my Visa 4111 1111 1111 1111, expiry 04/27.", [(CARD, "4111 1111 1111 1111")]),
    ("Card number: 5555-5555-5555-4444", [(CARD, "5555-5555-5555-4444")]),
    ("Amex 3782 822463 10005 is on file.", [(CARD, "3782 822463 10005")]),
    ("Paid with 6011111111111117 yesterday.", [(CARD, "6011111111111117")]),
    ("JCB card 3530 1113 3330 0000 was declined.", [(CARD, "3530 1113 3330 0000")]),
    ("Diners Club 3056 930902 5904 expired.", [(CARD, "3056 930902 5904")]),
    ("The new Mastercard 2221 3231 9487 5741 arrived today.", [(CARD, "2221 3231 9487 5741")]),
    ("card 4526018159083012 cvv 123", [(CARD, "4526018159083012")]),
    ("An old 13-digit Visa: 4960308246280.", [(CARD, "4960308246280")]),
    ("Discover 6567 1276 8426 8462 for the hotel.", [(CARD, "6567 1276 8426 8462")]),
    ("Please bill 5119 4821 9935 1815 for the order.", [(CARD, "5119 4821 9935 1815")]),
    (
        "My card is 4111 1111 1111 1111 - thanks, Robert Garcia",
        [(CARD, "4111 1111 1111 1111"), (NAME, "Robert Garcia")],
    ),
    ("card: 4111 11111111 1111 (as typed by the customer)", [(CARD, "4111 11111111 1111")]),
    # hard negatives
    ("Order 4111 1111 1111 1112 failed the check.", []),
    ("Account 9666 1934 5145 0612 is a loyalty number.", []),
    ("IMEI 352310077283783 belongs to the handset.", []),
    ("Invoice 1234 5678 9012 3456 is overdue.", []),
    ("The years 2019 2020 2021 2022 were hard.", []),
    ("ISBN 9780306406157 is the paperback.", []),
    ("Tracking 1Z999AA10123456784 shows delivery.", []),
    # ------------------------------------------------------------------ us_ssn
    ("SSN: 536-22-8890", [(SSN, "536-22-8890")]),
    (
        "Employee Maria Garcia, social security number 219-09-9999.",
        [(NAME, "Maria Garcia"), (SSN, "219-09-9999")],
    ),
    ("His SSN is 078-05-1120.", [(SSN, "078-05-1120")]),
    ("ssn=536-22-8891&dob=", [(SSN, "536-22-8891")]),
    ("The form lists 401-12-3456 as the taxpayer number.", [(SSN, "401-12-3456")]),
    ("Social Security No. 665-23-4411", [(SSN, "665-23-4411")]),
    ("Applicant SSN 899-01-2345.", [(SSN, "899-01-2345")]),
    ("Records show 012-34-5678 for the account holder.", [(SSN, "012-34-5678")]),
    ("The W-2 shows 555-32-1098.", [(SSN, "555-32-1098")]),
    ("Replace 342-71-9025 with your own number.", [(SSN, "342-71-9025")]),
    ("SSN (no dashes): 342719025", [(SSN, "342719025")]),
    ("social security 342 71 9025", [(SSN, "342 71 9025")]),
    # hard negatives
    ("The sample SSN 000-12-3456 is invalid.", []),
    ("Area 666-45-1234 is never issued.", []),
    ("ITIN 912-34-5678 is not a social security number.", []),
    ("Group 123-00-4567 is unused.", []),
    ("Serial 123-45-0000 is unused.", []),
    ("Part number 12-345-6789 is on the box.", []),
    # ------------------------------------------------------------------ uk_nino
    ("National Insurance number: AB 12 34 56 C", [(NINO, "AB 12 34 56 C")]),
    ("NI number JG103759A is on the payslip.", [(NINO, "JG103759A")]),
    ("Her NINO is CE123456D.", [(NINO, "CE123456D")]),
    ("Quote PX 45 67 89 B on all letters.", [(NINO, "PX 45 67 89 B")]),
    ("HMRC wrote to him about NY 55 12 88 A.", [(NINO, "NY 55 12 88 A")]),
    ("ni: ZR998877C", [(NINO, "ZR998877C")]),
    ("Employee NI ST 98 76 54 A", [(NINO, "ST 98 76 54 A")]),
    ("national insurance no. WL 20 30 40 D", [(NINO, "WL 20 30 40 D")]),
    ("KE102938B is printed on the card.", [(NINO, "KE102938B")]),
    ("Payroll record - NIN: HA 00 11 22 C.", [(NINO, "HA 00 11 22 C")]),
    ("Lower-case ab123456c was typed into the form.", [(NINO, "ab123456c")]),
    # hard negatives
    ("The HMRC example QQ 12 34 56 C is not a real number.", []),
    ("Prefix GB 12 34 56 A is never allocated.", []),
    ("AB123456E has an invalid suffix.", []),
    ("DF123456A breaks the prefix rules.", []),
    ("AO123456B uses O as the second letter.", []),
    ("Flight AB12345C departs at noon.", []),
    # ------------------------------------------------------------------ ca_sin
    ("SIN: 130 692 544", [(SIN, "130 692 544")]),
    ("Social Insurance Number 295-711-774 on file.", [(SIN, "295-711-774")]),
    ("NAS 377 412 150 (numéro d'assurance sociale).", [(SIN, "377 412 150")]),
    ("Her SIN is 447-280-389.", [(SIN, "447-280-389")]),
    ("Enter SIN 552 808 412 on line 3.", [(SIN, "552 808 412")]),
    ("The T4 shows 648-525-384.", [(SIN, "648-525-384")]),
    ("SIN 788 539 336 belongs to the applicant.", [(SIN, "788 539 336")]),
    ("Temporary resident SIN 919-161-463.", [(SIN, "919-161-463")]),
    ("sin: 178 778 932", [(SIN, "178 778 932")]),
    ("Employer records 242-180-966 for her.", [(SIN, "242-180-966")]),
    ("Numéro d'assurance sociale : 400339073", [(SIN, "400339073")]),
    # hard negatives
    ("SIN 130 692 545 fails the checksum.", []),
    ("The sample SIN 046 454 286 starts with 0.", []),
    ("Mixed 130-692 544 separators.", []),
    ("Unassigned 830 494 035 starts with 8.", []),
    ("Call 604 555 0123 for the Vancouver office.", [(NANP, "604 555 0123")]),
    ("Between 100 200 300 people attended.", []),
    # ------------------------------------------------------------------ iban
    (
        "Pay to DE89 3704 0044 0532 0130 00 and quote the invoice.",
        [(IBAN, "DE89 3704 0044 0532 0130 00")],
    ),
    ("IBAN: GB82WEST12345698765432", [(IBAN, "GB82WEST12345698765432")]),
    (
        "Virement sur FR09 3137 3537 9907 5116 3726 516.",
        [(IBAN, "FR09 3137 3537 9907 5116 3726 516")],
    ),
    ("Rekening NL04 RABO 2202 9729 97 van de vereniging.", [(IBAN, "NL04 RABO 2202 9729 97")]),
    ("BE40 5288 2001 8263 is the club account.", [(IBAN, "BE40 5288 2001 8263")]),
    ("Transferencia a ES28 3043 4839 5486 2057 9868.", [(IBAN, "ES28 3043 4839 5486 2057 9868")]),
    (
        "Bonifico IT08 2828 8072 9022 2791 8058 887 ricevuto.",
        [(IBAN, "IT08 2828 8072 9022 2791 8058 887")],
    ),
    ("Konto AT711803340187801759 bei der Bank.", [(IBAN, "AT711803340187801759")]),
    ("CH39 8983 4788 7838 4837 2 (Zürich)", [(IBAN, "CH39 8983 4788 7838 4837 2")]),
    (
        "Przelew na PL01 6167 5136 1341 2524 2731 6723.",
        [(IBAN, "PL01 6167 5136 1341 2524 2731 6723")],
    ),
    ("IE93 AIBK 1311 4402 4264 62 for rent.", [(IBAN, "IE93 AIBK 1311 4402 4264 62")]),
    ("Konto NO86 0234 4834 782.", [(IBAN, "NO86 0234 4834 782")]),
    (
        "GB13 NWBK 0008 8387 3716 78 - Sarah Thompson",
        [(IBAN, "GB13 NWBK 0008 8387 3716 78"), (NAME, "Sarah Thompson")],
    ),
    ("iban de89370400440532013000 (typed in lower case)", [(IBAN, "de89370400440532013000")]),
    # hard negatives
    ("IBAN DE88 3704 0044 0532 0130 00 has wrong check digits.", []),
    ("DE89 3704 0044 0532 0130 0 is one digit short.", []),
    ("XX89 3704 0044 0532 0130 00 has no country.", []),
    ("Reference AB12 CDEF 3456 7890 12 is an order id.", []),
    ("GB82 WEST 1234 5698 7654 33 was mistyped.", []),
    # ------------------------------------------------------------------ ipv4
    ("The server at 192.168.1.10 stopped responding.", [(IP4, "192.168.1.10")]),
    ("Blocked 203.0.113.45 after repeated login failures.", [(IP4, "203.0.113.45")]),
    ("Set the DNS to 8.8.8.8 and 1.1.1.1.", [(IP4, "8.8.8.8"), (IP4, "1.1.1.1")]),
    ("ssh admin@10.0.0.5", [(IP4, "10.0.0.5")]),
    ("Client IP: 172.16.254.1", [(IP4, "172.16.254.1")]),
    ("curl http://127.0.0.1:8080/health", [(IP4, "127.0.0.1")]),
    ("2023-05-01 12:00:01 198.51.100.23 GET /index.html", [(IP4, "198.51.100.23")]),
    ("The gateway is 192.0.2.254.", [(IP4, "192.0.2.254")]),
    ("Visitors from 81.2.69.160 were counted.", [(IP4, "81.2.69.160")]),
    ("The router's WAN address was 100.64.0.1 last week.", [(IP4, "100.64.0.1")]),
    ("Edited by 94.23.250.17 (anonymous)", [(IP4, "94.23.250.17")]),
    # hard negatives
    ("Upgrade to release 1.2.3.4.5 of the library.", []),
    ("256.100.50.25 is not a valid address.", []),
    ("The subnet 192.168.1 is incomplete.", []),
    ("Octet 192.168.1.300 is out of range.", []),
    ("The meeting is on 01.02.03.04 in the old notation.", []),
    ("Install driver version 2.0.0.1 from the vendor.", []),
    # ------------------------------------------------------------------ ipv6
    ("The host resolves to 2001:db8::1.", [(IP6, "2001:db8::1")]),
    (
        "Ping 2001:0db8:85a3:0000:0000:8a2e:0370:7334 to test.",
        [(IP6, "2001:0db8:85a3:0000:0000:8a2e:0370:7334")],
    ),
    ("Link-local fe80::1ff:fe23:4567:890a on eth0.", [(IP6, "fe80::1ff:fe23:4567:890a")]),
    ("Loopback is ::1 in IPv6.", [(IP6, "::1")]),
    ("Mapped address ::ffff:192.0.2.128 appears in logs.", [(IP6, "::ffff:192.0.2.128")]),
    ("Allow 2606:4700:4700::1111 through the firewall.", [(IP6, "2606:4700:4700::1111")]),
    ("Listening on [2001:db8:abcd:12::7]:443", [(IP6, "2001:db8:abcd:12::7")]),
    (
        "Client 2a02:ab88:1c0:9e00:4d2e:1f9:c1a5:6b7 connected.",
        [(IP6, "2a02:ab88:1c0:9e00:4d2e:1f9:c1a5:6b7")],
    ),
    ("DNS 2001:4860:4860::8888 answered.", [(IP6, "2001:4860:4860::8888")]),
    ("Prefix 2001:db8:1234::/48 was assigned.", [(IP6, "2001:db8:1234::")]),
    (
        "Edited by 2600:1700:e3a0:8c10:5d4e:22b1:aa0f:91c2",
        [(IP6, "2600:1700:e3a0:8c10:5d4e:22b1:aa0f:91c2")],
    ),
    # hard negatives
    ("The meeting runs 10:30:45 to 11:15:00.", []),
    ("A ratio of 3:2:1 was used.", []),
    ("fe80::1::2 has two gaps and is invalid.", []),
    ("C++ code uses std::vector and Foo::Bar.", []),
    ("Scores were 21:19:25:23 in the final.", []),
    ("Isaiah 40:31:2 is cited wrongly.", []),
    # ------------------------------------------------------------------ mac_address
    ("The laptop's MAC is 00:1A:2B:3C:4D:5E.", [(MAC, "00:1A:2B:3C:4D:5E")]),
    ("Whitelist device a4-5e-60-c2-11-9f on the router.", [(MAC, "a4-5e-60-c2-11-9f")]),
    ("The Cisco switch shows 0023.04ab.cdef on port 7.", [(MAC, "0023.04ab.cdef")]),
    ("ether 3c:22:fb:8a:91:07 txqueuelen 1000", [(MAC, "3c:22:fb:8a:91:07")]),
    ("Device: F0:18:98:4E:22:B1", [(MAC, "F0:18:98:4E:22:B1")]),
    ("HWaddr 00:0c:29:3f:47:8a", [(MAC, "00:0c:29:3f:47:8a")]),
    ("Bluetooth address DC-A6-32-01-AB-CD", [(MAC, "DC-A6-32-01-AB-CD")]),
    (
        "Registered MACs: 08:00:27:AA:BB:CC and 52:54:00:12:34:56.",
        [(MAC, "08:00:27:AA:BB:CC"), (MAC, "52:54:00:12:34:56")],
    ),
    ("The printer (b8:27:eb:45:67:89) went offline.", [(MAC, "b8:27:eb:45:67:89")]),
    ("Station 001A.2B3C.4D5E joined.", [(MAC, "001A.2B3C.4D5E")]),
    ("wlan0 hw address is 001a2b3c4d5e", [(MAC, "001a2b3c4d5e")]),
    # hard negatives
    ("Five pairs 00:1A:2B:3C:4D are not a MAC.", []),
    ("Seven pairs 00:1A:2B:3C:4D:5E:6F are not one either.", []),
    ("Mixed 00:1A-2B:3C:4D:5E separators.", []),
    ("Non-hex GG:1A:2B:3C:4D:5E value.", []),
    ("Request 123e4567-e89b-12d3-a456-426614174000 failed.", []),
    ("Color codes 00-1A-2B and 3C-4D-5E were used.", []),
    # ------------------------------------------------------------------ street_address
    (
        "Ship it to 1600 Pennsylvania Avenue NW, Washington, DC 20500.",
        [(ADDR, "1600 Pennsylvania Avenue NW")],
    ),
    ("Our office moved to 350 5th Ave, Suite 400, New York.", [(ADDR, "350 5th Ave, Suite 400")]),
    ("She lives at 42 Maple Street in Springfield.", [(ADDR, "42 Maple Street")]),
    ("Send mail to 221 Elm St. Apt 3B", [(ADDR, "221 Elm St. Apt 3B")]),
    ("The bakery at 77 Massachusetts Ave is open late.", [(ADDR, "77 Massachusetts Ave")]),
    ("Return address: 1234 Sunset Blvd, Los Angeles", [(ADDR, "1234 Sunset Blvd")]),
    ("We met at 9 Old Mill Road.", [(ADDR, "9 Old Mill Road")]),
    ("Deliveries go to 500 W Madison St.", [(ADDR, "500 W Madison St")]),
    ("The house at 18 Willow Lane was sold.", [(ADDR, "18 Willow Lane")]),
    (
        "He rents a flat at 3100 Martin Luther King Jr Way.",
        [(ADDR, "3100 Martin Luther King Jr Way")],
    ),
    ("Visit us at 85 Harbor Drive, Unit 12.", [(ADDR, "85 Harbor Drive, Unit 12")]),
    (
        "Mr. and Mrs. Dursley, of number 4 Privet Drive, were proud.",
        [(NAME, "Mrs. Dursley"), (ADDR, "4 Privet Drive")],
    ),
    ("Write to 14 rue de Rivoli, Paris.", [(ADDR, "14 rue de Rivoli")]),
    ("Office: Calle Mayor 5, Madrid", [(ADDR, "Calle Mayor 5")]),
    # hard negatives
    ("The 9 Supreme Court justices ruled unanimously.", []),
    ("She walked 3 miles down Main Street.", []),
    ("An apartment on Baker Street is for rent.", []),
    ("Chapter 12 Court Procedures explains the appeal.", []),
    ("In 2010 Main Street businesses struggled.", []),
    ("Highway 61 Revisited is an album.", []),
    # ------------------------------------------------------------------ date_of_birth
    ("Patient: Anna Kowalski, DOB 03/14/1978.", [(NAME, "Anna Kowalski"), (DOB, "03/14/1978")]),
    ("She was born on 12 March 1984 in Leeds.", [(DOB, "12 March 1984")]),
    ("Date of birth: 1990-07-04", [(DOB, "1990-07-04")]),
    ("He was born March 5, 1962, in Ohio.", [(DOB, "March 5, 1962")]),
    ("Birthday: 21/09/2001", [(DOB, "21/09/2001")]),
    ("D.O.B. 7.11.1955", [(DOB, "7.11.1955")]),
    ("He was born in Lagos on 1 January 1970.", [(DOB, "1 January 1970")]),
    ("Applicant's date of birth is 29 February 1988.", [(DOB, "29 February 1988")]),
    ("DOB: 12-25-1999", [(DOB, "12-25-1999")]),
    ("Born 4th July 1976, she grew up in Texas.", [(DOB, "4th July 1976")]),
    ("birth date 10/02/85", [(DOB, "10/02/85")]),
    ("Name: J. Doe (b. 14 Aug 1948)", [(NAME, "J. Doe"), (DOB, "14 Aug 1948")]),
    (
        "Her date of birth, which she gave to the clerk last week, is 5 May 1980.",
        [(DOB, "5 May 1980")],
    ),
    ("DOB 1980/05/05 on the scanned form", [(DOB, "1980/05/05")]),
    # hard negatives
    ("She was born on 31/02/1990, the form says.", []),
    ("The baby will be born on 12 March 2999 in the story.", []),
    ("The company was founded on 12 March 1984.", []),
    ("Released 1984-03-12 in Europe.", []),
    ("DOB 13/13/1980 is garbled.", []),
    ("The birthday party is on Saturday at 3.", []),
    # ------------------------------------------------------------------ url_credentials
    (
        "Connect with postgres://admin:s3cr3t@db.internal:5432/app",
        [(URL, "postgres://admin:s3cr3t@db.internal:5432")],
    ),
    (
        "Clone via https://deploy:ghp_a1B2c3D4e5@github.com/org/repo.git",
        [(URL, "https://deploy:ghp_a1B2c3D4e5@github.com")],
    ),
    (
        "Files at ftp://anonymous:guest@ftp.example.org/pub",
        [(URL, "ftp://anonymous:guest@ftp.example.org")],
    ),
    ("MONGO_URL=mongodb://root:example@mongo:27017", [(URL, "mongodb://root:example@mongo:27017")]),
    (
        "BROKER=amqp://guest:guest@rabbitmq.local:5672//",
        [(URL, "amqp://guest:guest@rabbitmq.local:5672")],
    ),
    (
        "http://user:pa%24%24word@192.168.0.10/admin",
        [(URL, "http://user:pa%24%24word@192.168.0.10")],
    ),
    (
        "SMTP_URL=smtp://mailer:Xy9!kL@smtp.mailhost.com:587",
        [(URL, "smtp://mailer:Xy9!kL@smtp.mailhost.com:587")],
    ),
    (
        "The leaked config had mysql://wp_user:Pa55w0rd@127.0.0.1:3306/wordpress.",
        [(URL, "mysql://wp_user:Pa55w0rd@127.0.0.1:3306")],
    ),
    (
        "git remote add origin https://alice:token123@gitlab.example.com/alice/proj.git",
        [(URL, "https://alice:token123@gitlab.example.com")],
    ),
    ("sftp://backup:hunter2@files.example.net", [(URL, "sftp://backup:hunter2@files.example.net")]),
    ("REDIS_URL=redis://:p4ssw0rd@localhost:6379/0", [(URL, "redis://:p4ssw0rd@localhost:6379")]),
    # hard negatives
    ("https://example.com/login?user=admin:pass", []),
    ("http://localhost:8080/api/v1/users", []),
    ("https://example.com:8443/path/to/page", []),
    ("Use https://:@example.com only in tests.", []),
    ("The time was 10:30@home.", []),
    # ------------------------------------------------------------------ aws_access_key
    ("aws_access_key_id = AKIAIOSFODNN7EXAMPLE", [(AWS, "AKIAIOSFODNN7EXAMPLE")]),
    ("Leaked key AKIALZGCJN4QAVSYEEFN in a public gist.", [(AWS, "AKIALZGCJN4QAVSYEEFN")]),
    ("export AWS_ACCESS_KEY_ID=AKIAPAXX5I6IYLJTOPMK", [(AWS, "AKIAPAXX5I6IYLJTOPMK")]),
    ('"AccessKeyId": "ASIAAXTJMKV47PUZQM3M",', [(AWS, "ASIAAXTJMKV47PUZQM3M")]),
    ("key: AKIAMY6F2DGGCQPZQ27S secret: (redacted)", [(AWS, "AKIAMY6F2DGGCQPZQ27S")]),
    ("The CI log printed AKIALEIO6ERNNBER24PD twice.", [(AWS, "AKIALEIO6ERNNBER24PD")]),
    ("creds=AKIACLSXIFXI4VICB6WT;", [(AWS, "AKIACLSXIFXI4VICB6WT")]),
    ("Rotate AKIACBE6ETUIEE4XCIVW now.", [(AWS, "AKIACBE6ETUIEE4XCIVW")]),
    (
        "Temporary credentials ASIANYOUNII7WCERKH46 expire in an hour.",
        [(AWS, "ASIANYOUNII7WCERKH46")],
    ),
    ("[default] aws_access_key_id=AKIAF6E2B7AYYAEFFHQ2", [(AWS, "AKIAF6E2B7AYYAEFFHQ2")]),
    ("session ASIARN2Y7U4UECRCRWTB", [(AWS, "ASIARN2Y7U4UECRCRWTB")]),
    # hard negatives
    ("Truncated AKIAIOSFODNN7EXAMPL in the docs.", []),
    ("akiaiosfodnn7example is lower case.", []),
    ("AKIBIOSFODNN7EXAMPLE has the wrong prefix.", []),
    ("AKIAIOSFODNN7EXAMPLEX is too long.", []),
    ("The acronym ASIA-PACIFIC appears in the report.", []),
    # ------------------------------------------------------------------ private_key
    (
        "id_rsa:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA",
        [(KEY, "-----BEGIN RSA PRIVATE KEY-----")],
    ),
    (
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
        [(KEY, "-----BEGIN PRIVATE KEY-----")],
    ),
    ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB", [(KEY, "-----BEGIN EC PRIVATE KEY-----")]),
    (
        "cat ~/.ssh/id_ed25519\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk",
        [(KEY, "-----BEGIN OPENSSH PRIVATE KEY-----")],
    ),
    (
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIFHzBJBgkqhkiG",
        [(KEY, "-----BEGIN ENCRYPTED PRIVATE KEY-----")],
    ),
    ("-----BEGIN DSA PRIVATE KEY-----\nMIIBuwIBAAKBgQ", [(KEY, "-----BEGIN DSA PRIVATE KEY-----")]),
    (
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF",
        [(KEY, "-----BEGIN PGP PRIVATE KEY BLOCK-----")],
    ),
    (
        '"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvgIBADANBg',
        [(KEY, "-----BEGIN PRIVATE KEY-----")],
    ),
    ("key = '''-----BEGIN RSA PRIVATE KEY-----", [(KEY, "-----BEGIN RSA PRIVATE KEY-----")]),
    (
        "Paste it here: -----BEGIN OPENSSH PRIVATE KEY----- (then the body)",
        [(KEY, "-----BEGIN OPENSSH PRIVATE KEY-----")],
    ),
    ("TLS_KEY=-----BEGIN EC PRIVATE KEY-----", [(KEY, "-----BEGIN EC PRIVATE KEY-----")]),
    # hard negatives
    ("-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkq", []),
    ("-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+g", []),
    ("-----BEGIN PGP PUBLIC KEY BLOCK-----", []),
    ("Look for the BEGIN RSA PRIVATE KEY line in the file.", []),
    ("-----BEGIN CERTIFICATE REQUEST-----", []),
    # ------------------------------------------------------------------ jwt
    (f"Authorization: Bearer {_JWT1}", [(JWT, _JWT1)]),
    (f"Set-Cookie: session={_JWT2}; HttpOnly", [(JWT, _JWT2)]),
    (f"id_token={_JWT3}&state=xyz", [(JWT, _JWT3)]),
    (f"An unsigned token {_JWT_NONE} was accepted.", [(JWT, _JWT_NONE)]),
    (f'{{"access_token": "{_JWT1}"}}', [(JWT, _JWT1)]),
    (f"curl -H 'Authorization: Bearer {_JWT2}' https://api.example.com", [(JWT, _JWT2)]),
    (f"The log line was: token {_JWT3}", [(JWT, _JWT3)]),
    (f"jwt: {_JWT1}\nexp: 1516239022", [(JWT, _JWT1)]),
    (f"See {_JWT2}.", [(JWT, _JWT2)]),
    (f"localStorage.setItem('t', '{_JWT3}')", [(JWT, _JWT3)]),
    # hard negatives
    (f"A header without alg: {_JWT_NOALG}", []),
    ("Two parts only: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0", []),
    ("eyJustkidding.notajwt.really is not base64 JSON.", []),
    ("Truncated eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ.eyJzdWIiOiIxIn0.abc", []),
    ("The file name archive.tar.gz has dots too.", []),
    # ------------------------------------------------------------------ bitcoin_address
    (
        "The genesis address is 1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa.",
        [(BTC, "1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa")],
    ),
    (
        "Donate to 3J98t1WpEZ73CNmQviecrnyiWrnqRhWNLy please.",
        [(BTC, "3J98t1WpEZ73CNmQviecrnyiWrnqRhWNLy")],
    ),
    ("BTC: 1NqZUerZDQ8sTZ1V3GCRFRGYmE5sxq5rX4", [(BTC, "1NqZUerZDQ8sTZ1V3GCRFRGYmE5sxq5rX4")]),
    (
        "Send 0.5 BTC to 141vRqE8aoQL9PaQ3bztKpg8CouF74FPCd by Monday.",
        [(BTC, "141vRqE8aoQL9PaQ3bztKpg8CouF74FPCd")],
    ),
    (
        "wallet 1LJpCGNtjgaFkiwajnhqC3quu6URA5yySz (cold storage)",
        [(BTC, "1LJpCGNtjgaFkiwajnhqC3quu6URA5yySz")],
    ),
    (
        "Ransom note: pay 1BFMz81Xnbv8ddd3aqs47kdEhjyZbd4B43 within 48 hours.",
        [(BTC, "1BFMz81Xnbv8ddd3aqs47kdEhjyZbd4B43")],
    ),
    (
        "Multisig 3Eg6yKh76tPabCDdh7MrKyse4X6jSofw7u holds the funds.",
        [(BTC, "3Eg6yKh76tPabCDdh7MrKyse4X6jSofw7u")],
    ),
    ("address=3FrQSB8r1JHGMpKGhxJKQ8guxuKmoFTyP3", [(BTC, "3FrQSB8r1JHGMpKGhxJKQ8guxuKmoFTyP3")]),
    ("Tips: 1EsqurMSdwuoEp4LpzSqmymzpLhcLwAetN", [(BTC, "1EsqurMSdwuoEp4LpzSqmymzpLhcLwAetN")]),
    (
        "Exchange deposit 36UWUYmxcihxkpnXi5zGGd9iwCs5hAXWB2.",
        [(BTC, "36UWUYmxcihxkpnXi5zGGd9iwCs5hAXWB2")],
    ),
    (
        "Pay to bc1qar0srrr7xfkvy5l643lydnw9re59gtzzwf5mdq (SegWit).",
        [(BTC, "bc1qar0srrr7xfkvy5l643lydnw9re59gtzzwf5mdq")],
    ),
    # hard negatives
    ("Typo 1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNb breaks the checksum.", []),
    ("Short 1A1zP1eP5QGefi2DMPT is not an address.", []),
    ("Ether 0x742d35Cc6634C0532925a3b844Bc454e4438f44e is another chain.", []),
    ("Video id 1dQw4w9WgXcQabcdefghijkLmnoPqrsT2 is random.", []),
    ("3xAmpleAddressWithoutAValidChecksum12 looks similar.", []),
    # ------------------------------------------------------------------ vin
    ("VIN 1HGCM82633A004352 is on the title.", [(VIN, "1HGCM82633A004352")]),
    ("Chassis number: 1M8GDM9AXKP042788", [(VIN, "1M8GDM9AXKP042788")]),
    ("The car (WBAWF7BV2RE874633) was sold at auction.", [(VIN, "WBAWF7BV2RE874633")]),
    ("Recall applies to 2T1S8TA635E881817.", [(VIN, "2T1S8TA635E881817")]),
    ("vin=3VWTETSP1H6761740", [(VIN, "3VWTETSP1H6761740")]),
    ("Tesla 5YJNEKYT5YW992070 needs a new battery.", [(VIN, "5YJNEKYT5YW992070")]),
    ("Honda JHM8UGP84KV777183 was stolen last night.", [(VIN, "JHM8UGP84KV777183")]),
    ("Truck VIN: 1FTEFKT00E9415377", [(VIN, "1FTEFKT00E9415377")]),
    ("Hyundai KMH2BLA8315642656 passed inspection.", [(VIN, "KMH2BLA8315642656")]),
    ("Mercedes WDDXHYAX64Y613044 imported.", [(VIN, "WDDXHYAX64Y613044")]),
    ("Volvo YV10E21E3M4404104 registered to the estate.", [(VIN, "YV10E21E3M4404104")]),
    ("Registration lists 1G1KSU498LN560688.", [(VIN, "1G1KSU498LN560688")]),
    # hard negatives
    ("VIN 1HGCM82643A004352 has a wrong check digit.", []),
    ("VIN 1HGCM82633A00435 is 16 characters long.", []),
    ("VIN 1HGCM8263IA004352 contains an I.", []),
    ("Order 12345678901234567 is all digits.", []),
    ("Hash 3F2A9B7C1D4E5F6A7 is hex.", []),
    # ------------------------------------------------------------------ passport_number
    ("Passport No. K1234567, issued in London.", [(PASS, "K1234567")]),
    ("passport number: 533380006", [(PASS, "533380006")]),
    ("Her passport (C03005988) expires next year.", [(PASS, "C03005988")]),
    ("Passport: X12345678", [(PASS, "X12345678")]),
    ("US passport #A12345678 was reported lost.", [(PASS, "A12345678")]),
    ("Enter the passport number 12AB34567 exactly.", [(PASS, "12AB34567")]),
    ("Passport J8369854 was scanned at the gate.", [(PASS, "J8369854")]),
    ("PASSPORT NUMBER: P1234567", [(PASS, "P1234567")]),
    ("The traveller's passport, number 503000012, was stamped.", [(PASS, "503000012")]),
    ("Reisepass/Passport: C01X00T47", [(PASS, "C01X00T47")]),
    (
        "Passport details are on file; the document number printed on page two is 845123987.",
        [(PASS, "845123987")],
    ),
    ("Travel document no. E12345678 (passport of the bearer)", [(PASS, "E12345678")]),
    # hard negatives
    ("The passport photo must be 2x2 inches.", []),
    ("Passport fees rose to 130 dollars.", []),
    ("The passport office is closed until 2025.", []),
    ("She lost her passport at Gate B12.", []),
    ("Employee ID K1234567 is on the badge.", []),
    ("Passport renewal fee: 1300000 won at the embassy.", []),
    ("passport application form DS-11", []),
    # ------------------------------------------------------------------ person_name
    ("Yesterday Mary Johnson signed the lease.", [(NAME, "Mary Johnson")]),
    ("Ask Dr. Patel about the results.", [(NAME, "Dr. Patel")]),
    ("A letter from Mr. John Q. Smith arrived on Tuesday.", [(NAME, "Mr. John Q. Smith")]),
    ("Prof. Chen teaches the Monday seminar.", [(NAME, "Prof. Chen")]),
    ("Michael Anthony Brown was elected mayor.", [(NAME, "Michael Anthony Brown")]),
    (
        "The panel included James McDonald and Sarah O'Connor.",
        [(NAME, "James McDonald"), (NAME, "Sarah O'Connor")],
    ),
    ("Karen Smith-Jones chaired the meeting.", [(NAME, "Karen Smith-Jones")]),
    ("Mrs. Okafor replied the next day.", [(NAME, "Mrs. Okafor")]),
    (
        "Linda Nguyen and David Kim founded the company in 2004.",
        [(NAME, "Linda Nguyen"), (NAME, "David Kim")],
    ),
    ("According to Ms. Rodriguez, the shipment is late.", [(NAME, "Ms. Rodriguez")]),
    ("Jennifer Lee scored twice in the second half.", [(NAME, "Jennifer Lee")]),
    (
        "Aarav Sharma and Siobhan Murphy won the prize.",
        [(NAME, "Aarav Sharma"), (NAME, "Siobhan Murphy")],
    ),
    ("Nguyen Van Thanh spoke first.", [(NAME, "Nguyen Van Thanh")]),
    ("Thanks to Emily Carter for the photographs.", [(NAME, "Emily Carter")]),
    ("MARY JOHNSON (seller) signed below.", [(NAME, "MARY JOHNSON")]),
    # hard negatives
    ("We flew from New York to the United States capital.", []),
    ("May Day parades filled the streets.", []),
    ("Grace Church was rebuilt after the fire.", []),
    ("Virginia Beach hosts a music festival.", []),
    ("The Jordan River flows south.", []),
    ("Victoria Station was crowded.", []),
    ("Carolina Panthers fans gathered downtown.", []),
    ("George Washington University is in the capital.", []),
    ("Christian Science Monitor published the story.", []),
    ("The Elizabeth Line opened in 2022.", []),
]
