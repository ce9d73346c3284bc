// llama.cpp's own GBNF parser and grammar matcher, for tests/test_grammar_llama.py: built with g++
// against the libllama.so that llama-cpp-python ships (it exports these C++ functions), run as a
// child process so that an input which crashes or hangs llama.cpp cannot take the test run along.
//
// The declarations below restate llama.cpp's src/llama-grammar.h (the layout of the parser
// object and the signatures of the exported functions); nothing here re-implements llama.cpp.
//
// Requests arrive on stdin as length-prefixed fields ("<decimal length>\n<bytes>"):
//   parse  GRAMMAR                 -> "OK", symbol and rule lines, "END"  |  "ERR <hex message>"
//   match  GRAMMAR ROOT N then N strings, each "K" then K (token id, piece) pairs
//                                  -> "INIT_FAIL"  |  one line of N digits, 1 = the string matches
// Every answer is flushed before the next request is read.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

struct llama_vocab;
typedef int32_t llama_token;

enum llama_gretype {
    LLAMA_GRETYPE_END = 0,
};

typedef struct llama_grammar_element {
    enum llama_gretype type;
    uint32_t value;
} llama_grammar_element;

using llama_grammar_rule = std::vector<llama_grammar_element>;
using llama_grammar_stack = std::vector<const llama_grammar_element *>;
using llama_grammar_rules = std::vector<llama_grammar_rule>;
using llama_grammar_stacks = std::vector<llama_grammar_stack>;

struct llama_grammar_parser {
    const llama_vocab * vocab;
    std::map<std::string, uint32_t> symbol_ids;
    llama_grammar_rules rules;

    llama_grammar_parser(const struct llama_vocab * vocab = nullptr) : vocab(vocab) {}

    bool parse(const char * src);
};

struct llama_grammar;

struct llama_grammar * llama_grammar_init_impl(const struct llama_vocab * vocab, const char * grammar_str,
                                               const char * grammar_root, bool lazy, const char ** trigger_patterns,
                                               size_t num_trigger_patterns, const llama_token * trigger_tokens,
                                               size_t num_trigger_tokens);
void llama_grammar_free_impl(struct llama_grammar * grammar);
llama_grammar_stacks & llama_grammar_get_stacks(struct llama_grammar * grammar);
void llama_grammar_accept_token(struct llama_grammar & grammar, llama_token token, const std::string & piece);

static bool read_field(std::string & out) {
    std::string len;
    int c;
    while ((c = std::getchar()) != EOF && c != '\n') {
        len.push_back(static_cast<char>(c));
    }
    if (c == EOF) {
        return false;
    }
    size_t n = std::stoul(len);
    out.resize(n);
    return n == 0 || std::fread(&out[0], 1, n, stdin) == n;
}

static std::string hex(const std::string & s) {
    static const char * digits = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) {
        out.push_back(digits[c >> 4]);
        out.push_back(digits[c & 15]);
    }
    return out.empty() ? "-" : out;
}

// stderr goes to a temporary file while llama.cpp parses, so that its message can be returned
static std::string capture_stderr(const std::function<void()> & fn) {
    std::fflush(stderr);
    FILE * tmp = std::tmpfile();
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    fn();
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string text;
    std::rewind(tmp);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, tmp)) > 0) {
        text.append(buf, n);
    }
    std::fclose(tmp);
    return text;
}

static void do_parse(const std::string & grammar) {
    llama_grammar_parser parser;
    bool ok = false;
    std::string err = capture_stderr([&] { ok = parser.parse(grammar.c_str()); });
    if (!ok || parser.rules.empty()) {
        std::printf("ERR %s\n", hex(err).c_str());
        return;
    }
    std::printf("OK\n");
    for (const auto & kv : parser.symbol_ids) {
        std::printf("S %s %u\n", hex(kv.first).c_str(), kv.second);
    }
    for (const auto & rule : parser.rules) {
        std::printf("R");
        for (const auto & e : rule) {
            std::printf(" %d:%u", static_cast<int>(e.type), e.value);
        }
        std::printf("\n");
    }
    std::printf("END\n");
}

static void do_match() {
    std::string grammar, root, count;
    read_field(grammar);
    read_field(root);
    read_field(count);
    size_t n = std::stoul(count);
    std::vector<std::vector<std::pair<llama_token, std::string>>> inputs(n);
    for (auto & input : inputs) {
        std::string k;
        read_field(k);
        size_t m = std::stoul(k);
        for (size_t i = 0; i < m; i++) {
            std::string id, piece;
            read_field(id);
            read_field(piece);
            input.emplace_back(static_cast<llama_token>(std::stol(id)), piece);
        }
    }
    // a fresh grammar per input: resetting the stacks alone would keep the partial UTF-8 state
    auto init = [&] {
        llama_grammar * g = nullptr;
        capture_stderr([&] { g = llama_grammar_init_impl(nullptr, grammar.c_str(), root.c_str(), false, nullptr, 0, nullptr, 0); });
        return g;
    };
    llama_grammar * probe = init();
    if (probe == nullptr) {
        std::printf("INIT_FAIL\n");
        return;
    }
    llama_grammar_free_impl(probe);
    std::string result;
    for (const auto & input : inputs) {
        llama_grammar * g = init();
        bool matched = true;
        for (const auto & [token, piece] : input) {
            try {
                llama_grammar_accept_token(*g, token, piece);
            } catch (const std::runtime_error &) {
                matched = false;
                break;
            }
            if (llama_grammar_get_stacks(g).empty()) {
                matched = false;
                break;
            }
        }
        if (matched) {
            matched = false;
            for (const auto & stack : llama_grammar_get_stacks(g)) {
                matched = matched || stack.empty();
            }
        }
        llama_grammar_free_impl(g);
        result.push_back(matched ? '1' : '0');
    }
    std::printf("%s\n", result.empty() ? "-" : result.c_str());
}

int main() {
    std::string command;
    while (read_field(command)) {
        if (command == "parse") {
            std::string grammar;
            read_field(grammar);
            do_parse(grammar);
        } else if (command == "match") {
            do_match();
        } else {
            std::printf("BAD %s\n", command.c_str());
        }
        std::fflush(stdout);
    }
    return 0;
}
